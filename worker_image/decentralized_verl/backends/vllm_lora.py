"""A vLLM engine over a 4-bit base with LoRA adapters hot-swapped per policy version (QLoRA rollouts).

The engine loads the base once through vLLM's bitsandbytes loader (`quantization="bitsandbytes"`, which
quantizes a plain checkpoint as it loads: the dequantized 4-bit base, so the same blocks come out), with
LoRA enabled. That loader quantizes every plain checkpoint as NF4 with double quantization, whatever the
job asked for, so only that quantization is served (the spec and `lora_engine_kwargs` refuse the others).
Each version then costs only its adapters: written as a PEFT adapter folder and named in a `LoRARequest`
that every later generate call carries, instead of reloading every weight. Kept apart from the backend so
the choices can be read and tested without vLLM installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.errors import ModelError
from decentralized_verl.models.lora import is_lora
from decentralized_verl.models.quantization import describe_quantization, is_quantized
from decentralized_verl.spec.catalogue.backends import VLLM

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts."""
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hot_swaps_adapters(model: torch.nn.Module) -> bool:
    """Whether the vLLM engine for `model` keeps a 4-bit base and swaps LoRA adapters per version."""
    return is_lora(model) and is_quantized(model)


def engine_dtype(model: torch.nn.Module) -> torch.dtype:
    """The engine's dtype: the 4-bit layers' compute dtype (the rest of the model is fp32 only because
    PEFT's k-bit preparation made it so for training)."""
    described = describe_quantization(model) or {}
    return _DTYPES.get(str(described.get("computeDtype")), torch.float32)


def lora_engine_kwargs(model: Any) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for a 4-bit base with one LoRA adapter active at a time. The engine
    quantizes the base it is given in one way only (`VLLM.quantizes_on_load`); a model held in another
    is refused, since the engine would then sample from another base than the learner's."""
    described = describe_quantization(model) or {}
    held = (described.get("type"), described.get("doubleQuant"))
    if held != VLLM.quantizes_on_load:
        wanted_type, wanted_double = VLLM.quantizes_on_load or (None, None)
        raise ModelError(
            f"spec.model.quantization: vLLM quantizes the base as type {wanted_type} with doubleQuant "
            f"{str(wanted_double).lower()} as it loads; this model holds type {held[0]}, doubleQuant "
            f"{str(held[1]).lower()}"
        )
    rank = max(int(r) for r in _ranks(model))
    fitting = next((r for r in VLLM_LORA_RANKS if r >= rank), None)
    if fitting is None:
        raise ValueError(
            f"spec.model.lora.rank: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]} (got {rank})"
        )
    return {
        "quantization": "bitsandbytes",
        "enable_lora": True,
        "max_lora_rank": fitting,
        "max_loras": 1,
    }


def _ranks(model: Any) -> list[int]:
    config = model.peft_config["default"]
    return [config.r, *dict(getattr(config, "rank_pattern", {}) or {}).values()]


def write_adapter(model: Any, folder: Path) -> Path:
    """The model's current adapters as a PEFT adapter folder (config and safetensors), replacing `folder`."""
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(str(folder))
    return folder


def lora_request(version: int, folder: Path) -> Any:
    """The `LoRARequest` naming `version`'s adapters (vLLM caches adapters by their integer id: one a
    version, never 0)."""
    from vllm.lora.request import LoRARequest  # noqa: PLC0415 optional: vllm (the vllm extra); this module loads without it

    return LoRARequest(f"policy-v{version}", version + 1, str(folder))
