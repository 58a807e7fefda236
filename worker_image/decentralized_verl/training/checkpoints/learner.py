"""The learner's training checkpoints: where they live, when one is due, how one is taken without stopping
training for the write, and how a run resumes from the newest one that checks out.

A checkpoint is a Hugging Face folder (`models.checkpoint`: written to a temporary folder, renamed into
place, sha256 manifest last) plus the optimizer and scheduler state and the loop's position (step, policy
version, sampler state). Taking one copies the model and optimizer state in memory at the step boundary
(the snapshot, the only pause) and writes it from a background thread while the next step runs; one write
is in flight at a time. A torn or corrupt newest checkpoint is skipped with a logged reason.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

from decentralized_verl.errors import CheckpointError
from decentralized_verl.training.checkpoints.adapters import (
    holds_adapters_only,
    is_adapter_checkpoint,
    restore_adapters,
    snapshot_adapters,
)
from decentralized_verl.training.checkpoints.folders import (
    checkpoint_dir,
    checkpoint_problem,
    checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
)
from decentralized_verl.training.checkpoints.sharded import (
    is_sharded_checkpoint,
    is_sharded_model,
    load_sharded,
    newest_usable,
)

log = logging.getLogger(__name__)

SNAPSHOT_BUDGET = 0.05
"""With automatic checkpoints, snapshots may cost at most this share of the training time."""
MAX_INTERVAL_S = 600.0
"""With automatic checkpoints, at most this long between two of them, whatever a snapshot costs."""


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the loop's counters and the sampler's position."""

    step: int
    policy_version: int
    sampler_state: dict[str, Any]
    folder: Path


@dataclass
class CheckpointClock:
    """When a checkpoint is due. `every` N steps, or automatically (None): every step while a snapshot
    costs at most SNAPSHOT_BUDGET of a step, else as often as that budget allows, and at least every
    MAX_INTERVAL_S. The last step always gets one. Pure."""

    every: int | None
    last_step: int = 0
    last_time: float | None = None

    def due(
        self, step: int, total: int, step_seconds: float, snapshot_seconds: float | None, now: float
    ) -> bool:
        if step >= total:
            return True
        if self.every is not None:
            return step % self.every == 0
        if snapshot_seconds is None:
            return True  # the first one measures what a snapshot costs
        interval = max(1, math.ceil(snapshot_seconds / (SNAPSHOT_BUDGET * max(step_seconds, 1e-9))))
        overdue = self.last_time is not None and now - self.last_time >= MAX_INTERVAL_S
        return step - self.last_step >= interval or overdue

    def taken(self, step: int, now: float) -> None:
        self.last_step, self.last_time = step, now


class CheckpointWriter:
    """Takes snapshots on the training thread and writes them in the background, one at a time."""

    def __init__(
        self,
        root: Path,
        trainer: Any,
        tokenizer: Any,
        keep: int,
        extras: dict[str, Callable[[], Any]] | None = None,
    ) -> None:
        """`extras`: file name -> a function returning a copy of more state to keep with each checkpoint."""
        hf_logging.disable_progress_bar()  # a bar per checkpoint would fill the learner's log
        remove_stale_temporaries(root)
        self.root = root
        self.extras = extras or {}
        self.trainer = trainer
        self.tokenizer = tokenizer
        self.keep = keep
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: concurrent.futures.Future[Path] | None = None
        self.snapshot_seconds: float | None = None
        self.write_seconds: float | None = None

    def take(self, step: int, loop_state: dict[str, Any]) -> Path:
        """Snapshot now (waiting for the previous write first), write in the background; returns where."""
        self.flush()
        began = time.perf_counter()
        model = _snapshot(self.trainer.model)
        optimizer = {
            "optimizer": copy.deepcopy(self.trainer.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.trainer.scheduler.state_dict()),
        }
        extras = {name: take() for name, take in self.extras.items()}
        self.snapshot_seconds = time.perf_counter() - began
        folder = checkpoint_dir(self.root, step)
        self._pending = self._pool.submit(self._write, folder, model, dict(loop_state), optimizer, extras)
        return folder

    def _write(
        self, folder: Path, model: Any, loop_state: dict[str, Any], optimizer: dict[str, Any], extras: dict
    ) -> Path:
        began = time.perf_counter()
        save_checkpoint(
            folder,
            model,
            self.tokenizer,
            extra_state=loop_state,
            optimizer_state=optimizer,
            extra_objects=extras,
        )
        prune(self.root, self.keep)
        self.write_seconds = time.perf_counter() - began
        return folder

    def flush(self) -> None:
        """Wait for the write in flight; a failed write is raised here (training must know)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)


class ShardedCheckpointWriter:
    """A sharded learner's checkpoints: every rank writes its own part at the step boundary (`save`, a
    collective through the learner group), so there is no in-memory snapshot to write in the background;
    the whole save counts as the snapshot (what the automatic interval budgets for)."""

    def __init__(self, root: Path, save: Callable[[Path, dict[str, Any]], None], keep: int) -> None:
        remove_stale_temporaries(root)  # rank 0's: no save of this run is in flight yet
        self.root = root
        self.save = save
        self.keep = keep
        self.snapshot_seconds: float | None = None
        self.write_seconds: float | None = None

    def take(self, step: int, loop_state: dict[str, Any]) -> Path:
        began = time.perf_counter()
        folder = checkpoint_dir(self.root, step)
        self.save(folder, dict(loop_state))
        prune(self.root, self.keep)
        self.snapshot_seconds = self.write_seconds = time.perf_counter() - began
        return folder

    def flush(self) -> None:
        """Nothing in flight: each save finished before `take` returned."""

    def close(self) -> None:
        """Nothing to wait for (see `flush`)."""


def restore_latest(trainer: Any, root: Path) -> ResumePoint | None:
    """Load the newest checkpoint that checks out into the trainer's model and optimizer (None: none).

    A sharded checkpoint (`training.sharded_checkpoint`) loads whatever the learner count that wrote it;
    for an FSDP2 trainer this is a collective every rank calls, and it accepts only sharded checkpoints.
    """
    remove_stale_temporaries(root)
    folder = newest_usable(root, trainer.model)
    if folder is None:
        found = checkpoints(root)
        if found:  # starting over would train again from step 0 and write its steps a second time
            reasons = "; ".join(f"{p.name}: {checkpoint_problem(p)}" for p in found[:5])
            raise CheckpointError(
                f"{root}: none of the {len(found)} checkpoints checks out ({reasons}); the learner will not "
                "start over on its own: remove the checkpoints (and the run's metrics) to start from step 0"
            )
        return None
    if is_sharded_checkpoint(folder):
        state = load_sharded(trainer.model, trainer.optimizer, trainer.scheduler, folder, verify=False)
    elif is_sharded_model(trainer.model):
        raise CheckpointError(
            f"checkpoint {str(folder)!r} was written by a ddp learner (a Hugging Face folder); "
            "an fsdp learner resumes only from sharded checkpoints"
        )
    else:
        state, folder = _restore_newest_loadable(trainer, root, folder)
    log.info("resumed from %s at step %d", folder, int(state["step"]))
    return ResumePoint(int(state["step"]), int(state["policy_version"]), state["sampler"], folder)


def _restore_newest_loadable(trainer: Any, root: Path, newest: Path) -> tuple[dict[str, Any], Path]:
    """Load `newest` (the newest checkpoint whose files match its manifest), else each older one that
    checks out: matching files may still hold what must not load (whoever could write the folder could
    rewrite its manifest too), such as a pickle that is not plain tensors, which `weights_only` refuses
    rather than runs. CheckpointError naming every checkpoint's problem when none loads."""
    problems: list[str] = []
    for folder in checkpoints(root):  # newest first: those before `newest` do not check out
        problem = None if folder == newest else checkpoint_problem(folder)
        if problem is None:
            try:
                return _restore(trainer, folder), folder
            except Exception as exc:  # refused pickles, shapes that do not fit, unreadable files
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                problem = f"does not load ({type(exc).__name__}: {first})"
                log.warning("checkpoint %s %s; trying an older one", folder, problem)
        problems.append(f"{folder.name}: {problem}")
    raise CheckpointError(
        f"{root}: no checkpoint loads ({'; '.join(problems[:5])}); the learner will not start over on its "
        "own: remove the checkpoints (and the run's metrics) to start from step 0"
    )


def _snapshot(model: Any) -> Any:
    """The model as a checkpoint keeps it, copied now: the adapters alone for LoRA on a 4-bit base (the
    base is never copied), else the whole model."""
    return snapshot_adapters(model) if holds_adapters_only(model) else copy.deepcopy(model)


def _restore(trainer: Any, folder: Path) -> dict[str, Any]:
    if is_adapter_checkpoint(folder):
        restore_adapters(trainer.model, folder)
    else:
        _restore_weights(trainer.model, folder)
    optimizer_file = folder / "optimizer.pt"
    if optimizer_file.exists():
        saved = torch.load(optimizer_file, map_location="cpu", weights_only=True)
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scheduler.load_state_dict(saved["scheduler"])
    return json.loads((folder / "trainer_state.json").read_text())


def _restore_weights(model: Any, folder: Path) -> None:
    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise RuntimeError(f"checkpoint {folder}: missing {real_missing[:3]}, unexpected {unexpected[:3]}")


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoint-N folders."""
    for old in checkpoints(root)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
