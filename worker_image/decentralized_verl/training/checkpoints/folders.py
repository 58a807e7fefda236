"""Hugging Face-format checkpoints (safetensors) that any stage, worker or user tool can load.

A checkpoint is written to a temporary sibling folder and renamed into place, so a crash never leaves a
half-written folder under a `checkpoint-N` name. Its last file is `manifest.json`, the sha256 of every other
file: `latest_checkpoint` skips a folder whose files no longer match it (a disk that corrupted or truncated
them) with a logged reason and falls back to the one before. LoRA models store the base weights unmerged
plus `adapter/`, so training can resume on the adapters.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from decentralized_verl.errors import ModelError
from decentralized_verl.models.lora import is_lora
from decentralized_verl.training.checkpoints.adapters import AdapterSnapshot, write_adapters
from decentralized_verl.training.checkpoints.space import module_bytes, room_for, tensor_bytes

TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"
OPTIMIZER_STATE = "optimizer.pt"
ADAPTER_DIR = "adapter"
_STEP_DIR = re.compile(r"^checkpoint-(\d+)$")
log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    path: Path
    model: torch.nn.Module
    tokenizer: Any
    extra_state: dict[str, Any] = field(default_factory=dict)
    optimizer_state: dict[str, Any] | None = None


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"checkpoint-{step}"


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    tokenizer: Any,
    extra_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra_objects: dict[str, Any] | None = None,
) -> Path:
    """Write model (safetensors), tokenizer, `trainer_state.json`, optionally `optimizer.pt` and other
    torch-saved objects by file name (a colocated critic's state) atomically. `model` may be an
    `AdapterSnapshot` (LoRA on a 4-bit base): then only the adapters and `base.json` are written.

    An existing folder at `path` is replaced only after the new one is complete. A volume without room
    for it is refused before anything is written (`space.room_for`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    needed = _checkpoint_bytes(model, optimizer_state, extra_objects)
    try:
        with room_for(target, needed):
            if isinstance(model, AdapterSnapshot):  # LoRA on a 4-bit base: adapters only, the base by digest
                write_adapters(model, tmp)
            elif is_lora(model):
                model.save_pretrained(tmp / ADAPTER_DIR)
                copy.deepcopy(model).unload().save_pretrained(tmp)
            else:
                model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / TRAINER_STATE).write_text(json.dumps(extra_state or {}, indent=2, sort_keys=True) + "\n")
            if optimizer_state is not None:
                torch.save(optimizer_state, tmp / OPTIMIZER_STATE)
            for name, obj in (extra_objects or {}).items():
                torch.save(obj, tmp / name)
            write_manifest(tmp)
            replace_folder(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _checkpoint_bytes(model: Any, optimizer_state: Any, extra_objects: Any) -> int:
    weights = tensor_bytes(model.adapters) if isinstance(model, AdapterSnapshot) else module_bytes(model)
    return weights + tensor_bytes(optimizer_state, extra_objects)


def checkpoint_head(path: str | Path) -> str:
    """'sequence_classification' or 'causal_lm', read from the saved config's architectures."""
    config = AutoConfig.from_pretrained(path)
    names = config.architectures or []
    return (
        "sequence_classification"
        if any(n.endswith("ForSequenceClassification") for n in names)
        else "causal_lm"
    )


def load_checkpoint(
    path: str | Path,
    *,
    head: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    merge_lora: bool = False,
    padding_side: str = "left",
) -> Checkpoint:
    """Load what `save_checkpoint` wrote; `head` defaults to the saved architecture.

    With an `adapter/` folder the adapters are re-attached (trainable) unless `merge_lora`, which folds
    them into the weights, as the next stage wants a plain model.
    """
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ModelError(f"checkpoint {str(folder)!r}: no config.json (not a checkpoint folder)")
    head = head or checkpoint_head(folder)
    classes = {
        "causal_lm": AutoModelForCausalLM,
        "sequence_classification": AutoModelForSequenceClassification,
    }
    if head not in classes:
        raise ModelError(f"checkpoint head must be one of {sorted(classes)} (got {head!r})")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = padding_side
    kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    model = classes[head].from_pretrained(folder, **kwargs)
    if (folder / ADAPTER_DIR).is_dir():
        model = PeftModel.from_pretrained(model, folder / ADAPTER_DIR, is_trainable=not merge_lora)
        if merge_lora:
            model = model.merge_and_unload()
    state_file = folder / TRAINER_STATE
    extra = json.loads(state_file.read_text()) if state_file.is_file() else {}
    opt_file = folder / OPTIMIZER_STATE
    optimizer_state = (
        torch.load(opt_file, map_location="cpu", weights_only=True) if opt_file.is_file() else None
    )
    return Checkpoint(folder, model.to(device), tokenizer, extra, optimizer_state)


def write_manifest(folder: Path) -> None:
    """Record the sha256 of every file in `folder` (written last, so its presence means complete)."""
    files = {
        str(path.relative_to(folder)): _sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"sha256": files}, indent=2, sort_keys=True) + "\n")


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` cannot be trusted (a file missing, changed or unlisted, or no manifest at all: a
    write that never completed, or files put there by hand), or None when it checks out."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return f"{MANIFEST} is missing (the checkpoint was never completed, or was not written by a learner)"
    try:
        listed = json.loads(manifest.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST} ({exc})"
    for name, digest in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha256_file(path) != digest:
            return f"{name} does not match its sha256 in {MANIFEST}"
    return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def checkpoints(root: str | Path) -> list[Path]:
    """Every `checkpoint-N` folder under `root`, newest (largest N) first; temporary folders ignored."""
    base = Path(root)
    if not base.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in base.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(steps, reverse=True)]


TEMPORARY_PREFIXES = (".tmp-checkpoint-", ".old-checkpoint-")
"""Folders a checkpoint write leaves when it is interrupted (`save_checkpoint`, `replace_folder`)."""


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Remove what interrupted checkpoint writes left under `root` (called at a learner's start, when
    no write of its own is in flight); returns what went."""
    base = Path(root)
    if not base.is_dir():
        return []
    stale = [p for p in base.iterdir() if p.is_dir() and p.name.startswith(TEMPORARY_PREFIXES)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s, left by an interrupted checkpoint write", path)
    return stale


def latest_checkpoint(root: str | Path, *, verify: bool = False) -> Path | None:
    """The newest `checkpoint-N` under `root`; with `verify`, the newest whose files match its manifest
    (each one skipped is logged with the reason)."""
    for folder in checkpoints(root):
        problem = checkpoint_problem(folder) if verify else None
        if problem is None:
            return folder
        log.warning("checkpoint %s cannot be used: %s; trying the one before", folder, problem)
    return None


def replace_folder(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target`; an existing `target` goes only once the new one is in place."""
    old = None
    if target.exists():
        old = target.parent / f".old-{target.name}-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
