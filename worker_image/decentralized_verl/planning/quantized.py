"""Memory of a 4-bit base (model.quantization, QLoRA), as models/quantization.py holds it. Pure arithmetic.

- Every linear of every decoder layer is 4-bit: half a byte a weight, plus one absmax scale per block of 64
  weights: fp32 (4 B) without double quantization; with it, one byte per block and an fp32 scale (with an
  fp32 offset) per 256 blocks, the nested quantization's own 256-entry fp32 code counted once per layer.
- Everything else (embeddings, LM head, norms, biases) is float32: PEFT's k-bit preparation, which every
  role applies to a 4-bit model so learner, reference and rollout compute alike. Hidden states are
  therefore float32 too (the embedding's output is), and so are the saved activations and KV caches.
- A 4-bit linear is dequantized to the compute dtype for each matmul: one layer's weight at a time, and
  the backward dequantizes it again for its input's gradient, so two of the largest linear's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decentralized_verl.planning.shapes import ModelShape

BLOCK = 64
"""Weights per 4-bit block (bitsandbytes)."""
NESTED_BLOCK = 256
"""Blocks per second-level block under double quantization."""
HIDDEN_BYTES = 4
"""Hidden states, activations and KV caches of a 4-bit model in this runtime: float32 (see above)."""
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class FourBit:
    """A model spec's `quantization`, as the planner needs it."""

    double_quant: bool = True
    compute_bytes: int = 2


def four_bit(model_spec: Any) -> FourBit | None:
    """The spec's 4-bit settings (computeDtype defaults to model.dtype); None for a full-precision base."""
    q = getattr(model_spec, "quantization", None)
    if q is None:
        return None
    compute = q.compute_dtype or getattr(model_spec, "dtype", "float32")
    return FourBit(bool(q.double_quant), _BYTES[compute])


def linear_parameters(shape: ModelShape) -> int:
    """Weights of every decoder linear: the ones held in 4 bits."""
    return shape.layers * sum(a * b for a, b in shape.linear_dims().values())


def scale_bytes(weights: int, double_quant: bool, layers: int) -> int:
    """Block scales of `weights` 4-bit weights in `layers` decoder layers of 7 linears each, with each
    linear's code tables (16 fp32 values; 256 more for the nested quantization)."""
    blocks = -(-weights // BLOCK)
    if not double_quant:
        return blocks * 4 + layers * 7 * 16 * 4
    nested = -(-blocks // NESTED_BLOCK)
    return blocks + nested * 4 + layers * 7 * (16 + NESTED_BLOCK + 1) * 4


def four_bit_bytes(shape: ModelShape, q: FourBit) -> tuple[int, int, int]:
    """(packed 4-bit weights, their scales, the float32 rest) in bytes."""
    linear = linear_parameters(shape)
    rest = shape.parameters() - linear
    return linear // 2, scale_bytes(linear, q.double_quant, shape.layers), rest * 4


def weights_detail(shape: ModelShape, q: FourBit) -> str:
    linear = linear_parameters(shape)
    rest = shape.parameters() - linear
    dq = "double-quantized" if q.double_quant else "fp32"
    return f"{linear:,} params x 0.5 B (4-bit) + {dq} block scales + {rest:,} params x 4 B (fp32)"


def weight_bytes(shape: ModelShape, q: FourBit) -> int:
    return sum(four_bit_bytes(shape, q))


def dequant_bytes(shape: ModelShape, q: FourBit, *, backward: bool) -> int:
    """The compute-dtype copy of the largest linear a matmul works on; twice with a backward."""
    largest = max(a * b for a, b in shape.linear_dims().values())
    return largest * q.compute_bytes * (2 if backward else 1)
