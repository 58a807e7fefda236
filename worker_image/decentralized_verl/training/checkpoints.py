"""The learner's training checkpoints: where they live, how one is written, how a run resumes from one.

A checkpoint is a Hugging Face folder (`models.checkpoint`, written atomically) plus the optimizer and
scheduler state and the loop's position (step, policy version, sampler state), so a restarted learner
continues with the same data order and weights.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.models.checkpoint import checkpoint_dir, latest_checkpoint, save_checkpoint
from decentralized_verl.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the loop's counters and the sampler's position."""

    step: int
    policy_version: int
    sampler_state: dict[str, Any]
    folder: Path


def checkpoint_root(spec: JobSpec, output: Path) -> Path:
    """`training.checkpoint.dir` (relative to the run folder unless absolute), else OUTPUT/checkpoints."""
    configured = spec.training.checkpoint.dir
    if configured is None:
        return output / "checkpoints"
    path = Path(configured)
    return path if path.is_absolute() else output / path


def restore_latest(trainer: Any, root: Path) -> ResumePoint | None:
    """Load the newest checkpoint under `root` into the trainer's model and optimizer (None: none)."""
    folder = latest_checkpoint(root)
    if folder is None:
        return None
    state = _restore(trainer, folder)
    log.info("resumed from %s at step %d", folder, int(state["step"]))
    return ResumePoint(int(state["step"]), int(state["policy_version"]), state["sampler"], folder)


def _restore(trainer: Any, folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    missing, unexpected = trainer.model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise RuntimeError(f"checkpoint {folder}: missing {real_missing[:3]}, unexpected {unexpected[:3]}")
    optimizer_file = folder / "optimizer.pt"
    if optimizer_file.exists():
        saved = torch.load(optimizer_file, weights_only=False)
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scheduler.load_state_dict(saved["scheduler"])
    return json.loads((folder / "trainer_state.json").read_text())


def save_training_checkpoint(
    root: Path, trainer: Any, tokenizer: Any, step: int, loop_state: dict[str, Any], keep: int
) -> Path:
    """Write checkpoint-STEP (weights, tokenizer, optimizer, loop state) and keep only the newest `keep`."""
    folder = save_checkpoint(
        checkpoint_dir(root, step),
        trainer.model,
        tokenizer,
        extra_state=loop_state,
        optimizer_state={
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
        },
    )
    prune(root, keep)
    return folder


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoint-N folders."""
    folders = sorted(
        (p for p in root.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
