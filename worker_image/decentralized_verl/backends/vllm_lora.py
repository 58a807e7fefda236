"""A vLLM engine over a 4-bit base with LoRA adapters hot-swapped per policy version (QLoRA rollouts).

The engine loads the base once, dequantized: every 4-bit weight written out in the layers' compute dtype
(`models/quantization.dequantized_state_dict`), which holds exactly the values the learner's 4-bit layers
multiply by, whatever the 4-bit type (NF4 or FP4, double quantization or not). vLLM (0.32, the pinned
engine) has no bitsandbytes loader to keep the base in 4 bits, so the rollout GPU holds the base at 2
bytes a weight (the planner counts it so); the learner, which also holds gradients and optimizer state,
keeps the 4-bit base. LoRA is enabled in the engine, so each version costs only its adapters: written as a
PEFT adapter folder and named in a `LoRARequest` that every later generate call carries, instead of
reloading every weight. Kept apart from the backend so the choices can be read and tested without vLLM.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.models.lora import is_lora
from decentralized_verl.models.quantization import describe_quantization, is_quantized

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
    """`vllm.LLM` keyword arguments for the dequantized base with one LoRA adapter active at a time."""
    rank = max(int(r) for r in _ranks(model))
    fitting = next((r for r in VLLM_LORA_RANKS if r >= rank), None)
    if fitting is None:
        raise ValueError(
            f"spec.model.lora.rank: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]} (got {rank})"
        )
    return {
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
