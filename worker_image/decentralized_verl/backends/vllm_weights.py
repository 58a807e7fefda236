"""The weights handed to a vLLM engine: the plain transformers names (LoRA merged, aliases once), written
to a safetensors file in RAM, because the engine runs in another process and tensors do not travel as
RPC arguments."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from torch import Tensor

from decentralized_verl.errors import ModelError
from decentralized_verl.models.lora import is_lora
from decentralized_verl.models.quantization import dequantized_state_dict, describe_quantization, is_quantized


def export_state_dict(model: torch.nn.Module, *, merge_adapters: bool = True) -> dict[str, Tensor]:
    """The weights an inference engine loads for ``model``, under the plain transformers names.

    A peft LoRA model is exported with every adapter merged into its base weight (``W + B A * s``) and
    the peft name segments removed, so the engine needs no LoRA support. Tensors that alias one
    another (a tied ``lm_head``) appear once, under their first name, because safetensors refuses
    shared storage and the engine re-ties them itself. Tensors are detached and contiguous. A 4-bit
    base's weights are dequantized to its compute dtype; `merge_adapters` False leaves the adapters out
    (the base an engine that applies adapters itself loads).
    """
    state = _merged_lora_state_dict(model, merge_adapters) if is_lora(model) else _plain_state_dict(model)
    out: dict[str, Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def _plain_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The state dict, a 4-bit base's weights dequantized to the compute dtype (no quantization state)."""
    if not is_quantized(model):
        return model.state_dict()
    return dequantized_state_dict(model, _compute_dtype(model))


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The 4-bit layers' compute dtype: what they compute in, so what their weights are worth."""
    name = str((describe_quantization(model) or {}).get("computeDtype", "float32"))
    return getattr(torch, name) if name in ("float32", "bfloat16", "float16") else torch.float32


def _merged_lora_state_dict(model: Any, merge: bool = True) -> dict[str, Tensor]:
    base = model.get_base_model()
    deltas: dict[str, Tensor] = {}
    for module_name, module in base.named_modules() if merge else ():
        if isinstance(module, LoraLayer) and not module.merged:
            adapters = [a for a in module.active_adapters if a in module.lora_A]
            if adapters:
                delta = sum(module.get_delta_weight(a) for a in adapters)
                deltas[f"{module_name}.base_layer.weight"] = delta
    merged: dict[str, Tensor] = {}
    for name, tensor in _plain_state_dict(base).items():
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        if "modules_to_save" in parts or "original_module" in parts:
            raise ModelError(
                f"spec.model.lora: {name!r}: LoRA modules_to_save are not supported by the vllm backend"
            )
        if name in deltas:
            tensor = (tensor.float() + deltas[name].float()).to(tensor.dtype)
        merged[".".join(p for p in parts if p != "base_layer")] = tensor
    return merged


def write_weights_file(tensors: Mapping[str, Tensor], folder: str | os.PathLike[str] | None = None) -> Path:
    """Write ``tensors`` to a fresh safetensors file in RAM (``/dev/shm`` when present) and return it."""
    if folder is None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = Path(folder) / f"dverl-weights-{os.getpid()}-{uuid.uuid4().hex}.safetensors"
    save_file(dict(tensors), str(path))
    return path
