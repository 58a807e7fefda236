"""A frozen base held in 4 bits (QLoRA): every linear layer of the decoder becomes a bitsandbytes
`Linear4bit` (NF4 or FP4 in blocks of 64 weights, each with its scale; with double quantization the scales
are quantized too), the embeddings and the LM head stay in full precision, as bitsandbytes and PEFT do.

Quantization happens in place on a model already built in full precision (from a folder or a tiny config),
one layer at a time as it is moved to `device`: the same path for every source, and the model's config
keeps no `quantization_config`, so an export merges adapters into a plain model of the base's dtype.
bitsandbytes runs these layers on CPUs too (its CPU backend), so the CPU tests run the code a GPU runs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from peft import prepare_model_for_kbit_training
from torch import nn

from decentralized_verl.errors import ModelError

BLOCK_SIZE = 64
"""Weights per quantization block in bitsandbytes' 4-bit layers (one absmax scale each)."""


def _bnb() -> Any:
    """bitsandbytes, imported when a 4-bit model is asked for (heavy, and not every role needs it)."""
    try:
        import bitsandbytes  # noqa: PLC0415 light: bitsandbytes, imported only by a process holding a 4-bit model
    except ImportError as exc:  # the worker extra installs it; a bare install may lack it
        raise ModelError(
            f"spec.model.quantization: bitsandbytes is not installed ({exc}); pip install bitsandbytes"
        ) from exc
    return bitsandbytes


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of `model` holds 4-bit weights."""
    bnb = _loaded_bnb()
    return bnb is not None and any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def _loaded_bnb() -> Any:
    """bitsandbytes if this process imported it (no model of it can be 4-bit otherwise)."""
    return sys.modules.get("bitsandbytes")


def quantize_linears(
    model: nn.Module,
    quantization: Any,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    field: str = "spec.model.quantization",
) -> nn.Module:
    """Replace each `nn.Linear` of `model` except its output embeddings with a 4-bit `Linear4bit` on
    `device` (quantized as it lands there), then apply PEFT's k-bit preparation: the remaining full-precision
    parameters (embeddings, norms, LM head) in float32 and the input embeddings' output requiring grad, so
    adapters in a frozen model get gradients. Returns `model`, changed in place."""
    bnb = _bnb()
    if getattr(quantization, "bits", 4) != 4:
        raise ModelError(f"{field}.bits: only 4 is supported (got {quantization.bits})")
    compute = _compute_dtype(quantization, dtype, field)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not head
    ]
    if not targets:
        raise ModelError(f"{field}: the model has no linear layers to quantize")
    for name, linear in targets:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, _four_bit(bnb, linear, quantization, compute, device))
    model.to(device)
    return _prepare_kbit(model)


def _compute_dtype(quantization: Any, dtype: torch.dtype, field: str) -> torch.dtype:
    name = getattr(quantization, "compute_dtype", None)
    if name is None:
        return dtype
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ModelError(f"{field}.computeDtype: must be one of {sorted(table)} (got {name!r})")
    return table[name]


def _four_bit(
    bnb: Any, linear: nn.Linear, quantization: Any, compute: torch.dtype, device: str | torch.device
) -> nn.Module:
    layer = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=compute,
        compress_statistics=bool(quantization.double_quant),
        quant_type=quantization.type,
        quant_storage=torch.uint8,
        device="meta",
    )
    layer.weight = bnb.nn.Params4bit(
        linear.weight.data.detach().to("cpu", torch.float32).contiguous(),
        requires_grad=False,
        compress_statistics=bool(quantization.double_quant),
        quant_type=quantization.type,
        blocksize=BLOCK_SIZE,
    )
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.data.detach().to(compute), requires_grad=False)
    # On CPUs with AVX-512 bf16, bitsandbytes repacks a layer's weights in place for a faster kernel the
    # first time it runs in eval mode without grad; after that its training path passes no gradient to
    # the layers below (0.50.2), and the two paths round differently. A learner's model also serves its
    # colocated reference and rollout, so every 4-bit layer keeps the one path training uses.
    layer.support_avx512bf16_for_cpu = False
    return layer.to(device)  # Params4bit quantizes as it moves


def _prepare_kbit(model: nn.Module) -> nn.Module:
    """PEFT's `prepare_model_for_kbit_training` without its gradient checkpointing: the learner's own
    activation checkpointing (roles.learner.activationCheckpointing) is the one this project uses."""
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def describe_quantization(model: nn.Module) -> dict[str, Any] | None:
    """The quantization a model's 4-bit layers hold, in the spec's names (None: no 4-bit layer)."""
    bnb = _loaded_bnb()
    if bnb is None:
        return None
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight
            return {
                "bits": 4,
                "type": weight.quant_type,
                "doubleQuant": bool(weight.compress_statistics),
                "computeDtype": str(module.compute_dtype).removeprefix("torch."),
                "blockSize": int(weight.blocksize),
            }
    return None


def dequantized_state_dict(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`model`'s state dict with every 4-bit weight dequantized to `dtype` and its quantization-state
    entries left out: the plain checkpoint an engine that quantizes on load (vLLM's bitsandbytes loader)
    or runs in full precision reads. The same blocks quantized again give the same 4-bit codes."""
    bnb = _loaded_bnb()
    four_bit = {}
    if bnb is not None:
        four_bit = {
            f"{name}.weight": module
            for name, module in model.named_modules()
            if isinstance(module, bnb.nn.Linear4bit)
        }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        owner = next((key for key in four_bit if name.startswith(key + ".")), None)
        if owner is not None:
            continue  # absmax, quant_map, nested_*, quant_state.*: folded into the dequantized weight
        if name in four_bit:
            weight = four_bit[name].weight
            out[name] = bnb.functional.dequantize_4bit(weight.data, weight.quant_state).to(dtype)
        else:
            out[name] = tensor
    return out
