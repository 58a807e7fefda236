"""Where a job's learner checkpoints live, torch-free: `dverl run` checks a run folder before anything
heavy loads, and the learner and `dverl export` find the checkpoints in the same place."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.spec import JobSpec


def checkpoint_root(spec: JobSpec, output: Path) -> Path:
    """`training.checkpoint.dir` (relative to the run folder unless absolute), else OUTPUT/checkpoints."""
    configured = spec.training.checkpoint.dir
    if configured is None:
        return output / "checkpoints"
    path = Path(configured)
    return path if path.is_absolute() else output / path
