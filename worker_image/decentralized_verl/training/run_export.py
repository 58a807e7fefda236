"""`dverl export`: find a run's checkpoints, pick one, and turn it into a plain Hugging Face folder.

A run folder is what `dverl run` writes: `job.yaml` (the full spec) and the checkpoints under
`training.checkpoint.dir` (relative to the run folder), else `checkpoints/`. Without a `job.yaml` the
checkpoints are looked for under `checkpoints/` and a sharded checkpoint is exported without tokenizer files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.errors import CheckpointError
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.training.checkpoints.folders import checkpoint_dir, checkpoints, latest_checkpoint
from decentralized_verl.training.checkpoints.root import checkpoint_root
from decentralized_verl.training.checkpoints.sharded import export_hf, is_sharded_checkpoint, require_empty

log = logging.getLogger(__name__)
JOB_FILE = "job.yaml"


@dataclass(frozen=True)
class RunCheckpoints:
    root: Path
    model_spec: Any | None
    """The job's `spec.model` (for the tokenizer); None without a job file."""


def run_checkpoints(run_dir: Path) -> RunCheckpoints:
    if not run_dir.is_dir():
        raise CheckpointError(f"RUN_DIR {str(run_dir)!r} is not a directory")
    job_file = run_dir / JOB_FILE
    if not job_file.is_file():
        return RunCheckpoints(run_dir / "checkpoints", None)

    spec = load_job(job_file).spec
    return RunCheckpoints(checkpoint_root(spec, run_dir), spec.model)


def choose_checkpoint(root: Path, step: int | None) -> Path:
    """`checkpoint-STEP` under `root`, or the newest whose files match its manifest when `step` is None."""
    found = checkpoints(root)
    if not found:
        raise CheckpointError(f"no checkpoints under {str(root)!r}")
    steps = "steps there: " + ", ".join(folder.name.removeprefix("checkpoint-") for folder in found)
    if step is None:
        folder = latest_checkpoint(root, verify=True)
        if folder is None:
            raise CheckpointError(
                f"no complete checkpoint under {str(root)!r}: none matches its manifest ({steps})"
            )
        return folder
    folder = checkpoint_dir(root, step)
    if folder not in found:
        raise CheckpointError(f"--step {step}: no checkpoint-{step} under {str(root)!r} ({steps})")
    return folder


def export_run(run_dir: str | Path, step: int | None, out: str | Path) -> Path:
    """Export one checkpoint of the run in `run_dir` to `out` (absent or empty); returns `out`."""
    out = Path(out)
    require_empty(out, "--output")
    run = run_checkpoints(Path(run_dir))
    folder = choose_checkpoint(run.root, step)
    if run.model_spec is None and is_sharded_checkpoint(folder):
        log.warning("no %s in %s: the export of %s has no tokenizer files", JOB_FILE, run_dir, folder.name)
    return export_hf(folder, out, model_spec=run.model_spec)


def main_export(run_dir: str | Path, step: int | None, out: str | Path) -> int:
    """`dverl export`: export the checkpoint and print the folder written."""
    print(export_run(run_dir, step, out))
    return 0
