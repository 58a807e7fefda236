"""`dverl run` of the tiny example with and without a competing process: thread pools that follow the
free cores (now) vs pools sized once per process (before) vs every process sized to the whole machine.

    python benchmarks/cpu_sharing.py                  # 200 steps, idle and with one busy competitor
    python benchmarks/cpu_sharing.py --steps 40 --repeats 3
    python benchmarks/cpu_sharing.py --smoke          # 4 steps, one repeat: what the test suite runs

Modes:
- `governed` (now): each worker computes on its share of the cores (`cpus.share_cores`), and its compute
  thread lowers torch's thread count while other programs keep cores busy (`thread_governor`).
- `shared`: shares as above, thread counts fixed at start (`DVERL_FIXED_THREADS=1`).
- `whole`: every worker's pools sized to the machine's cores and fixed, as `dverl run` first did.
Competitor: `none`, or `busy` (a separate process running 1-thread matmuls for the whole run).
Reported: wall time of each run (seconds from start to the summary), median over repeats, and the ratio
busy/none per mode. The JSON report goes to stdout's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))  # netlab: test and benchmark tooling, not in the package

from netlab.manifests import example_spec, write_job  # noqa: E402

EXAMPLE = ROOT / "examples" / "tiny-grpo.yaml"

RUNNER = """
import sys, json
from decentralized_verl.launch import local
mode, manifest, output = sys.argv[1:4]
if mode == "whole":  # before: every process sized to the machine
    local.share_cores = lambda cores, workers, overlapped: {name: cores for name, _ in workers}
from decentralized_verl.launch.run import run_job
summary = run_job(manifest, output, progress=False)
print(json.dumps({"steps": summary.get("steps")}))
"""

COMPETITOR = """
import torch
torch.set_num_threads(1)
a = torch.randn(384, 384)
while True:
    a = torch.tanh(a @ a)
"""


def manifest_with_steps(folder: Path, steps: int) -> Path:
    spec = example_spec(EXAMPLE)
    spec["training"]["steps"] = steps
    spec["training"]["evalEvery"] = 0
    return write_job(folder, EXAMPLE.stem, spec)  # the example's own job name


def one_run(mode: str, competitor: str, manifest: Path, output: Path) -> float:
    rival = None
    if competitor == "busy":
        rival = subprocess.Popen(
            [sys.executable, "-c", COMPETITOR], env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        time.sleep(1.0)
    try:
        began = time.perf_counter()
        fixed = {"DVERL_FIXED_THREADS": "1"} if mode in ("shared", "whole") else {}
        done = subprocess.run(
            [sys.executable, "-c", RUNNER, mode, str(manifest), str(output)],
            capture_output=True,
            text=True,
            env={**os.environ, **fixed},
        )
        wall = time.perf_counter() - began
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    if done.returncode != 0:
        raise SystemExit(f"{mode}/{competitor}: dverl run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    shutil.rmtree(output, ignore_errors=True)
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--modes", nargs="+", default=["whole", "shared", "governed"], choices=["whole", "shared", "governed"]
    )
    parser.add_argument("--competitors", nargs="+", default=["none", "busy"], choices=["none", "busy"])
    parser.add_argument("--smoke", action="store_true", help="4 steps, one repeat, governed mode only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.repeats, args.modes, args.competitors = 4, 1, ["governed"], ["none"]
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats: must be >= 1")
    report: dict = {"steps": args.steps, "cores": os.cpu_count(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = manifest_with_steps(folder, args.steps)
        for repeat in range(args.repeats):
            for competitor in args.competitors:  # interleaved, so drift hits every mode alike
                for mode in args.modes:
                    wall = one_run(mode, competitor, manifest, folder / f"run-{mode}-{competitor}-{repeat}")
                    report["runs"].setdefault(f"{mode}/{competitor}", []).append(wall)
                    print(
                        f"{mode:6s} competitor={competitor:4s} repeat {repeat}: {wall:.1f} s", file=sys.stderr
                    )
    medians = {key: statistics.median(walls) for key, walls in report["runs"].items()}
    report["median_s"] = medians
    for mode in args.modes:
        if f"{mode}/busy" in medians and f"{mode}/none" in medians:
            report[f"{mode}_slowdown_with_competitor"] = medians[f"{mode}/busy"] / medians[f"{mode}/none"]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
