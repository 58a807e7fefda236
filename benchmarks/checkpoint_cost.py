"""What checkpoints cost a run, from its metrics: the snapshot (the only pause, on the training path) and
the background write, against the step time.

    python benchmarks/checkpoint_cost.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a `dverl run` output folder (metrics.jsonl). Printed per run: checkpoints taken, median
and max snapshot seconds, median write seconds (off the training path), median step seconds, and the
snapshot's share of the training time.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def cost(run: Path) -> dict[str, float | int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    snapshots = [r["checkpoint_snapshot_seconds"] for r in rows if r.get("checkpoint_snapshot_seconds")]
    writes = [r["checkpoint_write_seconds"] for r in rows if r.get("checkpoint_write_seconds")]
    steps = [r["step_seconds"] for r in rows if r.get("step_seconds")]
    return {
        "steps": len(rows),
        "checkpoints": len(snapshots),
        "snapshot_median_s": statistics.median(snapshots) if snapshots else 0.0,
        "snapshot_max_s": max(snapshots, default=0.0),
        "write_median_s": statistics.median(writes) if writes else 0.0,
        "step_median_s": statistics.median(steps) if steps else 0.0,
        "snapshot_share": sum(snapshots) / sum(steps) if steps else 0.0,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for run in map(Path, argv):
        c = cost(run)
        print(
            f"{run}: {c['checkpoints']} checkpoints in {c['steps']} steps; snapshot median "
            f"{c['snapshot_median_s']:.3f} s (max {c['snapshot_max_s']:.3f}), background write median "
            f"{c['write_median_s']:.3f} s, step median {c['step_median_s']:.2f} s, snapshots "
            f"{100 * c['snapshot_share']:.1f}% of the training time"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
