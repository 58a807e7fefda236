"""Sharded checkpoints of FSDP2 learners (torch.distributed.checkpoint), resumable at another learner count,
and their export to a plain Hugging Face folder.

Every rank writes only its own shards of the model and optimizer (DTensor form, never gathered), so a
checkpoint costs each rank its share of the state, not the whole. DCP records where every piece of every
tensor lives, so loading reshards: a checkpoint written by 2 learners loads into 1 or 4, or into an
unsharded model in a process with no process group at all.

The folder is a `checkpoint-N` beside today's Hugging Face checkpoints (`models.checkpoint`), same naming,
keep policy and manifest, so `checkpoints` and `latest_checkpoint` list and verify both kinds:

    checkpoint-N/
      dcp/                  .metadata and one __<rank>_0.distcp per rank (model + optimizer shards)
      hf_config/            config.json (+ generation_config.json): enough to rebuild the model unsharded
      scheduler.pt          the LR scheduler's state
      trainer_state.json    the loop's position (step, policy_version, sampler state)
      sharded.json          the kind marker: format, world size at save, dtype
      manifest.json         the sha256 of every other file, written last

All of it lands in a temporary sibling folder first; rank 0 renames it into place after every rank's
shards are on disk, so a crash never leaves a partial folder under a `checkpoint-N` name. The folder must
be on storage every rank sees (a shared volume across machines), as DCP writes one folder from all ranks.

Collective or not is decided by the model: parameters that are DTensors (FSDP2) in an initialised process
group make `save_sharded` and `load_sharded` collectives every rank must call; a plain model is saved or
loaded by the calling process alone (DCP's `no_dist`), whatever process group exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from peft import PeftModel
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.loading import load_model_and_tokenizer, load_tokenizer
from decentralized_verl.training.checkpoints.adapters import is_adapter_checkpoint
from decentralized_verl.training.checkpoints.folders import (
    ADAPTER_DIR,
    MANIFEST,
    OPTIMIZER_STATE,
    TRAINER_STATE,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    replace_folder,
    write_manifest,
)
from decentralized_verl.training.checkpoints.space import out_of_space, ran_out, ran_out_reason

SHARDED_MARKER = "sharded.json"
DCP_DIR = "dcp"
CONFIG_DIR = "hf_config"
SCHEDULER_STATE = "scheduler.pt"
FORMAT = 1
"""Bumped when the folder's layout changes in a way an older reader would misread."""


# --------------------------------------------------------------------------------------------- kinds
def is_sharded_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / SHARDED_MARKER).is_file()


def is_sharded_model(model: torch.nn.Module) -> bool:
    """True for an FSDP2 model (its parameters are DTensors)."""
    return any(isinstance(param, DTensor) for param in model.parameters())


def sharded_info(folder: str | Path) -> dict[str, Any]:
    """The kind marker: format, world size at save, dtype, whether the optimizer was saved."""
    marker = Path(folder) / SHARDED_MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(folder)!r}: cannot read {SHARDED_MARKER} ({exc})") from exc
    if info.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {str(folder)!r}: {SHARDED_MARKER} format {info.get('format')!r} is not {FORMAT} "
            "(written by another dverl version)"
        )
    return info


def require_intact(folder: Path) -> None:
    problem = checkpoint_problem(folder)
    if problem is not None:
        raise CheckpointError(f"checkpoint {str(folder)!r} cannot be used: {problem}")


# ------------------------------------------------------------------------------------- collectives
def _collective(model: torch.nn.Module) -> bool:
    return dist.is_available() and dist.is_initialized() and is_sharded_model(model)


def from_rank0(value: Any, collective: bool) -> Any:
    """Rank 0's `value` on every rank (itself when not collective): one rank decides, all act alike."""
    if not collective:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def _single_process_allowed() -> Iterator[None]:
    """DCP warns on every single-process save or load; here that is the intent, not an accident."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank(collective: bool) -> int:
    return dist.get_rank() if collective else 0


def _world(collective: bool) -> int:
    return dist.get_world_size() if collective else 1


def newest_usable(root: str | Path, model: torch.nn.Module) -> Path | None:
    """The newest checkpoint under `root` whose files match its manifest, as rank 0 finds it, on every rank
    (collective for an FSDP2 model, so all ranks load the same one; only rank 0 reads every file)."""
    collective = _collective(model)
    found = latest_checkpoint(root, verify=True) if _rank(collective) == 0 else None
    return from_rank0(found, collective)


# ------------------------------------------------------------------------------------------- save
def save_sharded(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    folder: str | Path,
    state: dict[str, Any],
) -> None:
    """Write a sharded checkpoint to `folder` (a `checkpoint_dir(root, step)`), replacing one there.

    Collective for an FSDP2 model: every rank calls it, each writes its own shards; rank 0 then writes
    `state` (JSON: step, policy_version, sampler state), the scheduler, the config and the manifest, and
    renames the folder into place. Every rank returns once the checkpoint is in place, or raises the same
    error when it is not.
    """
    target = Path(folder)
    collective = _collective(model)
    rank = _rank(collective)
    tmp = None
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        (tmp / DCP_DIR).mkdir(parents=True)
    tmp = from_rank0(tmp, collective)
    error = None
    try:
        with _single_process_allowed():
            dcp.save(_dcp_state(model, optimizer), checkpoint_id=tmp / DCP_DIR, no_dist=not collective)
        if rank == 0:
            _write_rank0_files(tmp, model, optimizer, scheduler, state, _world(collective))
            write_manifest(tmp)
            replace_folder(tmp, target)
    except Exception as exc:  # every rank must hear of rank 0's failure, or the others would carry on
        full = out_of_space(exc, target.parent)
        error = ran_out_reason(target) if full else f"{type(exc).__name__}: {exc}"
        if not collective:
            if full:
                raise ran_out(target) from exc
            raise
    finally:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    error = from_rank0(error, collective) or error
    if error is not None:
        raise CheckpointError(f"checkpoint {str(target)!r} was not written: {error}")


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter name (FQN), in the model's own form: DTensor shards for
    FSDP2, whole tensors otherwise. Names, not positions, are what make a load at another world size work."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _write_rank0_files(
    tmp: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    state: dict[str, Any],
    world: int,
) -> None:
    config = getattr(model, "config", None)
    if config is None:
        raise CheckpointError("the model has no Hugging Face config to save (export would need one)")
    config.save_pretrained(tmp / CONFIG_DIR)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(tmp / CONFIG_DIR)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / SCHEDULER_STATE)
    (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    dtype = next(model.parameters()).dtype  # a DTensor's dtype is its shards'
    info = {
        "format": FORMAT,
        "kind": "fsdp" if is_sharded_model(model) else "unsharded",
        "world_size": world,
        "dtype": str(dtype).removeprefix("torch."),
        "optimizer": optimizer is not None,
        "scheduler": scheduler is not None,
    }
    (tmp / SHARDED_MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------- load
def load_sharded(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    folder: str | Path,
    *,
    verify: bool = True,
) -> dict[str, Any]:
    """Load a sharded checkpoint into `model`, `optimizer` and `scheduler` (each optional) whatever the
    world size at save; returns the loop state saved with it.

    Collective for an FSDP2 model (every rank calls it). With `verify`, rank 0 checks the manifest first
    and every rank refuses a checkpoint whose files do not match it, naming the file; pass False only when
    the caller has just verified the folder.
    """
    folder = Path(folder)
    collective = _collective(model)
    problem = None
    if _rank(collective) == 0:
        if not is_sharded_checkpoint(folder):
            problem = f"no {SHARDED_MARKER} (not a sharded checkpoint)"
        elif verify:
            problem = checkpoint_problem(folder)
    problem = from_rank0(problem, collective)
    if problem is not None:
        raise CheckpointError(f"checkpoint {str(folder)!r} cannot be used: {problem}")
    info = sharded_info(folder)
    if optimizer is not None and not info.get("optimizer"):
        raise CheckpointError(f"checkpoint {str(folder)!r} holds no optimizer state (saved without one)")
    wanted = _dcp_state(model, optimizer)
    with _single_process_allowed():
        dcp.load(wanted, checkpoint_id=folder / DCP_DIR, no_dist=not collective)
    if optimizer is None:
        set_model_state_dict(model, wanted["model"])
    else:
        set_state_dict(
            model, optimizer, model_state_dict=wanted["model"], optim_state_dict=wanted["optimizer"]
        )
    if scheduler is not None:
        if not (folder / SCHEDULER_STATE).is_file():
            raise CheckpointError(f"checkpoint {str(folder)!r} holds no {SCHEDULER_STATE}")
        scheduler.load_state_dict(torch.load(folder / SCHEDULER_STATE, weights_only=True))
    return json.loads((folder / TRAINER_STATE).read_text())


# ----------------------------------------------------------------------------------------- export
_TRAINING_ONLY = {MANIFEST, TRAINER_STATE, OPTIMIZER_STATE}


def require_empty(out: Path, what: str = "export folder") -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{what} {str(out)!r} is not empty")


def export_hf(folder: str | Path, out: str | Path, *, model_spec: Any | None = None) -> Path:
    """Turn a checkpoint, sharded or not, into a plain Hugging Face folder at `out` (absent or empty).

    Needs no process group and none of the ranks that wrote it: the model is rebuilt unsharded from the
    saved config and DCP reads every shard into it. The tokenizer comes from `model_spec` (the job's
    `spec.model`) for a sharded checkpoint, from the checkpoint itself for a Hugging Face one. LoRA
    checkpoints are exported with the adapters merged; adapters trained on a 4-bit base are merged into
    the base `model_spec` names, loaded in full precision in its dtype (`spec.model.dtype`).
    """
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {str(folder)!r} is not a directory")
    require_empty(out)
    require_intact(folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        if is_sharded_checkpoint(folder):
            _export_sharded(folder, tmp, model_spec)
        elif is_adapter_checkpoint(folder):
            _export_adapters(folder, tmp, model_spec)
        elif (folder / ADAPTER_DIR).is_dir():
            merged = load_checkpoint(folder, merge_lora=True)
            merged.model.save_pretrained(tmp)
            merged.tokenizer.save_pretrained(tmp)
        else:
            _copy_hf_files(folder, tmp)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _export_sharded(folder: Path, tmp: Path, model_spec: Any | None) -> None:
    info = sharded_info(folder)
    config = AutoConfig.from_pretrained(folder / CONFIG_DIR)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, info["dtype"]))
    state = {"model": model.state_dict()}
    # One process reads every rank's shards; the optimizer's entries in the checkpoint are not asked for.
    with _single_process_allowed():
        dcp.load(state, checkpoint_id=folder / DCP_DIR, no_dist=True)
    model.load_state_dict(state["model"])
    model.save_pretrained(tmp)
    if (folder / CONFIG_DIR / "generation_config.json").is_file():
        shutil.copy2(folder / CONFIG_DIR / "generation_config.json", tmp / "generation_config.json")
    if model_spec is not None:
        load_tokenizer(model_spec).save_pretrained(tmp)


def _export_adapters(folder: Path, tmp: Path, model_spec: Any | None) -> None:
    """Adapters trained on a 4-bit base, merged into that base in full precision and the base's dtype: the
    model a user serves without bitsandbytes (the adapters saw the NF4/FP4-rounded base; docs/qlora.md)."""
    if model_spec is None:
        raise CheckpointError(
            f"checkpoint {str(folder)!r} holds adapters only (its base is named by digest); exporting it "
            "needs the run's job.yaml to load the base from"
        )
    plain = model_spec.model_copy(update={"lora": None, "quantization": None})
    base, tokenizer = load_model_and_tokenizer(plain)
    merged = PeftModel.from_pretrained(base, folder / ADAPTER_DIR).merge_and_unload()
    merged.save_pretrained(tmp)
    source = folder if (folder / "tokenizer_config.json").is_file() else None
    (AutoTokenizer.from_pretrained(source) if source else tokenizer).save_pretrained(tmp)


def _copy_hf_files(folder: Path, tmp: Path) -> None:
    """A Hugging Face checkpoint already is the export: its files less the training-only ones."""
    tmp.mkdir()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in _TRAINING_ONLY and path.suffix != ".pt":
            shutil.copy2(path, tmp / path.name)
