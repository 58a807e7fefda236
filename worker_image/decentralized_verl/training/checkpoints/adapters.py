"""Checkpoints of LoRA adapters on a 4-bit base (QLoRA): the adapters and the optimizer state only, the base
named by the digest of its 4-bit tensors.

The base never changes during training and every process rebuilds it from the job's `spec.model`, so saving
it again at every checkpoint would only cost time and disk (gigabytes for a 7B base). What a checkpoint must
prove instead is that a resume puts the adapters back on the very base they were trained on: `base.json`
holds the digest of the base's quantized tensors (and the quantization that made them), and a resume on a
base with another digest is refused. Snapshots copy only the adapter tensors, never the 4-bit base.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.lora import is_lora
from decentralized_verl.models.quantization import describe_quantization, is_quantized

BASE_FILE = "base.json"
ADAPTER_DIR = "adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_DIGESTS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
"""A base's digest by its model object: gigabytes hashed once per process, not at every checkpoint."""


def holds_adapters_only(model: torch.nn.Module) -> bool:
    """Whether checkpoints of `model` keep its adapters alone: a LoRA model on a 4-bit base."""
    return is_lora(model) and is_quantized(model)


def is_adapter_checkpoint(folder: Path) -> bool:
    return (folder / BASE_FILE).is_file()


def base_digest(model: torch.nn.Module) -> str:
    """BLAKE2b over the names, dtypes, shapes and bytes of every tensor of the base (all but the adapters),
    in name order; the quantized bytes and their scales for a 4-bit base."""
    known = _DIGESTS.get(model)
    if known is not None:
        return known
    digest = hashlib.blake2b(digest_size=32)
    for name, tensor in sorted(model.state_dict().items()):
        if "lora_" in name:
            continue
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    value = digest.hexdigest()
    _DIGESTS[model] = value
    return value


@dataclass(frozen=True)
class AdapterSnapshot:
    """What an adapters-only checkpoint writes, copied at the step boundary: the adapter tensors on the
    CPU, their PEFT config, and the base's description (`base.json`)."""

    adapters: dict[str, torch.Tensor]
    peft_config: Any
    base: dict[str, Any]


def snapshot_adapters(model: Any) -> AdapterSnapshot:
    state = {k: v.detach().to("cpu").clone() for k, v in get_peft_model_state_dict(model).items()}
    base = {"digest": base_digest(model), "quantization": describe_quantization(model)}
    return AdapterSnapshot(state, model.peft_config["default"], base)


def write_adapters(snapshot: AdapterSnapshot, folder: Path) -> None:
    """`adapter/` as PEFT writes it (loadable by `PeftModel.from_pretrained`) and `base.json`."""
    adapter = folder / ADAPTER_DIR
    adapter.mkdir(parents=True, exist_ok=True)
    save_file(snapshot.adapters, str(adapter / ADAPTER_WEIGHTS))
    snapshot.peft_config.save_pretrained(str(adapter))
    (folder / BASE_FILE).write_text(json.dumps(snapshot.base, indent=2, sort_keys=True) + "\n")


def restore_adapters(model: Any, folder: Path) -> None:
    """Put the adapters saved in `folder` into `model`, refusing a base other than the one they trained on."""
    try:
        saved = json.loads((folder / BASE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(folder)!r}: cannot read {BASE_FILE} ({exc})") from exc
    if not holds_adapters_only(model):
        raise CheckpointError(
            f"checkpoint {str(folder)!r} holds LoRA adapters for a 4-bit base; this learner's model is not "
            "one (spec.model.quantization and spec.model.lora must be as when it was written)"
        )
    ours = base_digest(model)
    if saved.get("digest") != ours:
        raise CheckpointError(
            f"checkpoint {str(folder)!r}: its adapters were trained on base {str(saved.get('digest'))[:16]}, "
            f"this learner holds base {ours[:16]} (another spec.model or spec.model.quantization)"
        )
    state = load_file(str(folder / ADAPTER_DIR / ADAPTER_WEIGHTS))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise CheckpointError(f"checkpoint {str(folder)!r}: adapters the model lacks: {unexpected[:3]}")
