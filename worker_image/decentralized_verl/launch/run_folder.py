"""Whether `dverl run` may write into a run folder: an earlier run's results are never lost by accident.

A folder that already holds a run is continued (`--resume`), left alone (another `--output`), or deleted
on purpose (`--overwrite`); `--resume` with nothing to continue from, or on a run that already trained
every step, says so instead of starting over or counting past the end. Pure checks over the folder's
files, so the decision is made before any process starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from decentralized_verl.errors import DverlError

SETUP_FILES = frozenset({"job.yaml", "secrets"})
"""What `dverl run` writes before any worker starts (a manifest refused at that point leaves only these);
anything else in the folder is an earlier run's, or someone's, and is not written over."""


class RunFolderRefused(DverlError):
    """The run folder cannot be used as asked; the message names the folder and the choices."""


def earlier_run(output: Path) -> list[str]:
    """The files in `output` a new run would write over or mix with (empty when the folder is absent
    or holds only what a run writes before it starts)."""
    if not output.is_dir():
        return []
    return sorted(p.name for p in output.iterdir() if p.name not in SETUP_FILES)


def finished_steps(output: Path) -> int | None:
    """The step count an earlier run's summary reports (None: no summary, the run did not finish)."""
    try:
        summary = json.loads((output / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    steps = summary.get("steps") if isinstance(summary, dict) else None
    return steps if isinstance(steps, int) else None


def check_run_folder(
    output: Path, *, resume: bool, overwrite: bool, total_steps: int | None, checkpoints: Path
) -> None:
    """Raise RunFolderRefused unless `output` may be used as asked (`checkpoints`: where the job's
    checkpoints go; `total_steps`: the manifest's `training.steps`, None when it counts epochs)."""
    if resume and overwrite:
        raise RunFolderRefused("--resume and --overwrite exclude each other: continue the run, or delete it")
    found = earlier_run(output)
    if resume:
        if not output.is_dir():
            raise RunFolderRefused(
                f"--resume: {output} does not exist, so there is no run to continue; "
                "leave out --resume to start a new run there"
            )
        done = finished_steps(output)
        if done is not None and (total_steps is None or done >= total_steps):
            asked = f"training.steps is {total_steps}" if total_steps is not None else "it counted epochs"
            raise RunFolderRefused(
                f"--resume: the run in {output} already finished all {done} steps ({asked}); "
                "raise training.steps to train further, or start a new run with --output DIR"
            )
        if not _has_checkpoint(checkpoints):
            raise RunFolderRefused(
                f"--resume: {output} has no checkpoint to continue from (none under {checkpoints}); "
                "start over with --overwrite, or write a new run with --output DIR"
            )
        return
    if found and not overwrite:
        raise RunFolderRefused(
            f"{output} is not empty ({_listed(found)}); continue the run there with --resume, write a new "
            "run with --output DIR, or delete it and start over with --overwrite"
        )


def clear_run_folder(output: Path, checkpoints: Path) -> None:
    """Delete an earlier run's files (`--overwrite`): the folder's contents, and checkpoints kept
    elsewhere (`training.checkpoint.dir`)."""
    if checkpoints.exists() and not checkpoints.is_relative_to(output):
        shutil.rmtree(checkpoints)
    if output.is_dir():
        for entry in output.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _has_checkpoint(root: Path) -> bool:
    return root.is_dir() and any(p.is_dir() and p.name.startswith("checkpoint-") for p in root.iterdir())


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
