"""Per-GPU (or host) memory of generation: the HF backend's KV cache and workspace, and a vLLM engine's
weights, KV cache and workspace per GPU of its tensor-parallel group. Pure arithmetic on top of memory.py's
components, for rollout workers and a learner that generates itself (workers.py puts them together).

The vLLM engine reserves its `gpu_memory_utilization` share of the GPU at start whatever it needs, so
what is estimated here is whether its weights, the KV cache of one batch (at least one sequence of the
model's full context, which the engine refuses to start without) and its profiling workspace fit that share.
"""

from __future__ import annotations

from dataclasses import dataclass

from decentralized_verl.planning import quantized as q4
from decentralized_verl.planning.devices import GIB
from decentralized_verl.planning.memory import (
    Component,
    Device,
    kv_cache_bytes,
    layer_transient_bytes,
    weight_components,
)
from decentralized_verl.planning.shapes import ModelShape
from decentralized_verl.spec.catalogue.backends import BackendKind

HF_DECODE_ROWS = 64
"""The HF backend decodes at most this many responses together (backends/hf.py max_batch_size)."""
VLLM_UTILIZATION = 0.9
"""vLLM's default gpu_memory_utilization: the engine takes this share of the GPU, whatever it needs."""
VLLM_PROFILE_TOKENS = 8192
"""Tokens of the forward vLLM profiles at start (its default max_num_batched_tokens)."""
VLLM_MAX_SEQS = 256
"""Sequences vLLM samples together at most (max_num_seqs): its sampler's logits are sized for them."""
VLLM_GRAPHS = 1 * GIB
"""CUDA graphs, NCCL buffers and the CUDA context inside the vLLM engine."""
VLLM_CPU_KV = 2 * GIB
"""The KV cache a CPU vLLM engine gets (VLLM_CPU_KVCACHE_SPACE, which the vllm backend sets to 2 GiB)."""


@dataclass(frozen=True)
class Generation:
    """What one rollout worker generates at once."""

    sequences: int
    prompt_tokens: int
    response_tokens: int
    backend: BackendKind
    tensor_parallel: int = 1
    max_model_len: int | None = None
    """The vLLM engine's context (the model's max positions): it refuses to start unless one sequence
    that long fits in its KV cache."""


def hf_generation_components(
    shape: ModelShape,
    b: int,
    gen: Generation,
    on_gpu: bool,
    *,
    own_weights: bool,
    quantization: q4.FourBit | None = None,
) -> list[Component]:
    """The HF backend: weights (unless it generates with the learner's), the KV cache of the rows decoded
    together, and the larger of the prefill's layer temporaries and the decode step's logits; a 4-bit base
    (with its adapters, which are small) computes in float32 and dequantizes one layer at a time."""
    device: Device = "gpu" if on_gpu else "host"
    rows = min(gen.sequences, HF_DECODE_ROWS)
    length = gen.prompt_tokens + gen.response_tokens
    out = []
    if own_weights:
        out += weight_components(shape, b, device, quantization)
    if quantization is not None:
        b = q4.HIDDEN_BYTES
        out.append(
            Component(
                "dequantization",
                q4.dequant_bytes(shape, quantization, backward=False),
                device,
                phase="generation",
                detail="the largest 4-bit linear dequantized for its matmul",
            )
        )
    out.append(
        Component(
            "kv cache",
            kv_cache_bytes(shape, b, rows, length),
            device,
            phase="generation",
            detail=f"{rows} rows decoded together x {length} tokens",
        )
    )
    workspace = max(layer_transient_bytes(shape, b, rows * gen.prompt_tokens), rows * shape.vocab * 4 * 3)
    out.append(
        Component(
            "workspace", workspace, device, phase="generation", detail="prefill layer / sampling logits"
        )
    )
    return out


def vllm_components(
    shape: ModelShape, b: int, gen: Generation, on_gpu: bool, quantization: q4.FourBit | None = None
) -> list[Component]:
    """The vLLM engine, per GPU of its tensor-parallel group (on a CPU: its weights and fixed KV space).
    A 4-bit base is served dequantized (backends/vllm_lora.py: the pinned vLLM has no 4-bit loader), so
    the engine holds every weight, and its KV cache, in the 4-bit layers' compute dtype."""
    tp = max(gen.tensor_parallel, 1) if on_gpu else 1
    params = shape.parameters()
    if quantization is not None:
        b = quantization.compute_bytes
    length = gen.prompt_tokens + gen.response_tokens
    if not on_gpu:
        return [
            Component("engine weights", params * b, "host", detail=f"{params:,} params x {b} B"),
            Component("kv cache", VLLM_CPU_KV, "host", detail="VLLM_CPU_KVCACHE_SPACE (2 GiB)"),
        ]
    split = f" / {tp} GPUs (tensor parallel)" if tp > 1 else ""
    batch_kv = kv_cache_bytes(shape, b, gen.sequences, length, tp)
    minimum_kv = kv_cache_bytes(shape, b, 1, gen.max_model_len, tp) if gen.max_model_len else 0
    if minimum_kv > batch_kv:
        kv_detail = f"one sequence of max_model_len {gen.max_model_len:,} (vLLM's minimum to start){split}"
    else:
        kv_detail = f"{gen.sequences} sequences x {length} tokens{split}"
    profile = layer_transient_bytes(shape, b, VLLM_PROFILE_TOKENS) + VLLM_MAX_SEQS * shape.vocab * 4 * 2
    return [
        Component("weights", params * b // tp, "gpu", detail=f"{params:,} params x {b} B{split}"),
        Component("kv cache", max(batch_kv, minimum_kv), "gpu", detail=kv_detail),
        Component(
            "engine workspace",
            profile + VLLM_GRAPHS,
            "gpu",
            detail=f"profile forward of {VLLM_PROFILE_TOKENS} tokens, sampler, CUDA graphs",
        ),
    ]
