"""Async RL: step time and learning with `training.maxStaleness` k = 0 (on-policy) vs k = 1 (overlapped).

    python benchmarks/async_overlap.py --repeats 3            # tiny-grpo example, 60 steps per run
    python benchmarks/async_overlap.py --smoke                 # what the test suite runs

Each run is a real `dverl run` of examples/tiny-grpo.yaml (learner + rollout worker processes over gRPC)
with only maxStaleness and the step count changed; k = 0 and k = 1 runs alternate so machine noise hits both.
Reported per k: median steady-state step time (steps after the first two), wall time, mean reward over the
last 10 steps and the last eval accuracy; the ratio of median step times is the overlap gain, the reward and
accuracy differences are the learning-curve cost of learning from one-version-old samples.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))  # netlab: test and benchmark tooling, not in the package

from netlab.manifests import example_spec, write_job  # noqa: E402

EXAMPLE = ROOT / "examples" / "tiny-grpo.yaml"


def manifest(folder: Path, staleness: int, steps: int, eval_every: int, rollout_replicas: int) -> Path:
    spec = example_spec(EXAMPLE)
    spec["training"].update(steps=steps, evalEvery=eval_every, maxStaleness=staleness)
    spec["roles"]["rollout"]["replicas"] = rollout_replicas
    return write_job(folder, f"async-k{staleness}", spec)


def one_run(staleness: int, steps: int, eval_every: int, replicas: int) -> dict[str, float]:
    from decentralized_verl.launch.run import run_job
    from decentralized_verl.reporting.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="dverl-async-") as tmp:
        folder = Path(tmp)
        path = manifest(folder, staleness, steps, eval_every, replicas)
        started = time.perf_counter()
        run_job(path, folder / "run", progress=False, timeout=3600)
        wall = time.perf_counter() - started
        records = read_metrics(folder / "run" / "metrics.jsonl")
    steady = [r["step_seconds"] for r in records[2:]] or [r["step_seconds"] for r in records]
    evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
    return {
        "step_s_median": statistics.median(steady),
        "wall_s": wall,
        "reward_last10": statistics.fmean(r["reward_mean"] for r in records[-10:]),
        "eval_accuracy": evals[-1] if evals else float("nan"),
        "max_staleness_seen": max(r["staleness"] for r in records),
        "stale_dropped": sum(r["stale_dropped"] for r in records),
    }


def summarize(runs: dict[int, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for k, results in runs.items():
        out[str(k)] = {
            key: statistics.median(r[key] for r in results)
            for key in results[0]
            if key != "max_staleness_seen"
        }
        out[str(k)]["max_staleness_seen"] = max(r["max_staleness_seen"] for r in results)
        out[str(k)]["runs"] = len(results)
    return out


def table(summary: dict[str, dict[str, float]]) -> str:
    rows = [
        "| maxStaleness | runs | median step (s) | wall (s) | reward, last 10 steps | eval accuracy "
        "| staleness seen |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, s in summary.items():
        rows.append(
            f"| {k} | {s['runs']} | {s['step_s_median']:.3f} | {s['wall_s']:.1f} | {s['reward_last10']:.3f} "
            f"| {s['eval_accuracy']:.3f} | {s['max_staleness_seen']} |"
        )
    gain = summary["0"]["step_s_median"] / summary["1"]["step_s_median"]
    rows.append(f"\nOverlap gain (median step time k=0 / k=1): {gain:.2f}x")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per k, alternating k=0 and k=1")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--rollout-replicas", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="1 run per k, 6 steps (the test suite's check)")
    parser.add_argument("--json", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.steps, args.eval_every = 1, 6, 3
    runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for repeat in range(args.repeats):
        for k in (0, 1):
            result = one_run(k, args.steps, args.eval_every, args.rollout_replicas)
            runs[k].append(result)
            print(f"repeat {repeat + 1} k={k}: {result}", file=sys.stderr, flush=True)
    summary = summarize(runs)
    report = {"steps": args.steps, "repeats": args.repeats, "summary": summary, "runs": runs}
    print(table(summary), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
