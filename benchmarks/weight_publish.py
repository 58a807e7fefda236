"""Publishing one policy version: time and peak host memory of `WeightPublisher.publish` on this machine.

    python benchmarks/weight_publish.py                      # SmolLM2-135M in bf16, 5 repeats
    python benchmarks/weight_publish.py --model tiny --repeats 2

The learner's model is loaded once; each repeat publishes the next version (encode once for every
receiver: safetensors bytes cut into hashed chunks, the manifest signed), as the learner does after an
update. Reads of a GPU model go through `transport/weights/staging.HostStaging` in fixed buckets (pinned
on a GPU); on a CPU the parameters are read where they are. Reported: the model's and the bundle's bytes,
publish seconds (median), and the process's peak resident memory above what it held before the first
publish (sampled every 5 ms, and the kernel's high-water mark), in MB and as a multiple of the bundle:
what one version costs the learner's host, whatever the number of receivers (they fetch the one bundle
the publisher holds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_model, machine_info, set_threads


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def high_water_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Samples this process's resident memory in the background; `peak` is the largest seen."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (SmolLM2-135M, bf16) or tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the report here too")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)

    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport.weights.publish import WeightPublisher

    model, _, load_s = load_model(args.model, "bfloat16" if args.model == "smollm2" else "float32")
    device = next(model.parameters()).device
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    publisher = WeightPublisher(keep=1)
    times, peaks = [], []
    bundle_bytes = 0
    baseline = rss_bytes()
    high_before = high_water_bytes()
    for version in range(1, args.repeats + 1):
        with PeakRss() as watch:
            began = time.perf_counter()
            publisher.publish(rollout_state_dict(model), version)
            times.append(time.perf_counter() - began)
        peaks.append(watch.peak - baseline)
        bundle_bytes = publisher.get(version).bundle.header.total_bytes
    report = {
        "command": " ".join(["python", "benchmarks/weight_publish.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(threads),
        "model": args.model,
        "device": str(device),
        "load_s": round(load_s, 2),
        "model_mb": round(model_bytes / 1e6, 1),
        "bundle_mb": round(bundle_bytes / 1e6, 1),
        "publish_s_median": round(statistics.median(times), 3),
        "publish_s": [round(t, 3) for t in times],
        "peak_rss_above_baseline_mb": round(max(peaks) / 1e6, 1),
        "peak_rss_over_bundle": round(max(peaks) / max(1, bundle_bytes), 2),
        "high_water_rise_mb": round((high_water_bytes() - high_before) / 1e6, 1),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
