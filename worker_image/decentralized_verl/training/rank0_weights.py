"""Only rank 0 of a sharded group reads the model's weights; the others build it on the meta device (shapes,
no storage) and receive their shards from rank 0 once it is sharded.

Without this every rank loads the whole model before FSDP2 splits it, so each rank's peak memory is at
least the whole model even though it keeps 1/N. Here a rank > 0 never holds more than its shards: the
meta skeleton takes no memory, `sharding.shard_model` gives its shards storage (`to_empty`), and
`build_then_fill` has rank 0 broadcast its full tensors one at a time, each rank keeping its slice. Buffers
that are not in the state dict (rotary frequencies) are broadcast as they are. Rank 0 loads the whole model
as every rank did before and sends before it shards; weights memory-mapped from a safetensors file all
become resident while it sends, so rank 0's load peak can rise to the whole model plus its shards
(BENCHMARKS.md). Tied parameters are sent once, under their first name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM

from decentralized_verl.models.loading import (
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_hf_dir,
    torch_dtype,
)
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.runtime import device
from decentralized_verl.training.sharding import named_state, tied_names

T = TypeVar("T")
BLOCK_BYTES = 16 * 1024 * 1024
"""Rows sent per broadcast: bounds what a rank holds beyond its shards while it is filled."""


def uses_rank0_load(sharded: bool, world: int) -> bool:
    """Whether this rank's group loads through rank 0: fsdp over two or more ranks of a process group."""
    return sharded and world > 1 and dist.is_initialized()


def load_for_rank(
    model_spec: Any,
    *,
    rank: int,
    meta: bool,
    on: torch.device | None = None,
    sharded: bool = False,
    field: str = "spec.model",
) -> tuple[nn.Module, Any]:
    """Rank 0 (or any rank when `meta` is False): the loaded model and tokenizer, on `on` (default: the
    process's device) or, for a model FSDP will shard, in host memory, so that no rank ever holds the whole
    model on its GPU (`fully_shard` moves each rank's shards there). Ranks > 0 with `meta`: the same
    architecture on the meta device, and the tokenizer."""
    if not meta or rank == 0:
        return load_model_and_tokenizer(model_spec, device="cpu" if sharded else on, field=field)
    tokenizer = load_tokenizer(model_spec, field=field)
    with torch.device("meta"):
        model = _skeleton(model_spec, tokenizer, field)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _skeleton(model_spec: Any, tokenizer: Any, field: str) -> nn.Module:
    dtype = torch_dtype(getattr(model_spec, "dtype", "float32"), field=f"{field}.dtype")
    folder = resolve_hf_dir(model_spec, field=field)
    if folder is None:
        config = tiny_config(model_spec.tiny, tokenizer, field=f"{field}.tiny")
        return build_tiny(config, model_spec.tiny.seed).to(dtype)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)


def build_then_fill(model: nn.Module, *, rank: int, build: Callable[[], T]) -> T:
    """Collective: `build()` (which shards `model`, e.g. makes the trainer) with every rank's weights equal
    to rank 0's. Rank 0 sends from its whole model first, then builds, so sharding frees its full
    parameters layer by layer as usual; the others build first (their shards get storage), then receive."""
    if rank == 0:
        _broadcast_weights(model)
        return build()
    built = build()
    _broadcast_weights(model)
    return built


def _broadcast_weights(model: nn.Module) -> None:
    """One block of rows at a time (at most BLOCK_BYTES), in state-dict order (the same on every rank,
    sharded or not): rank 0 sends, every other rank receives the block and copies the rows of it that fall
    in its shard (FSDP2 shards dim 0 as `torch.chunk` does), so none holds more than its shards and one
    block; a whole-tensor broadcast of a large embedding would cost a transient copy of it."""

    rank, world = dist.get_rank(), dist.get_world_size()
    wire = device.collective_device()
    aliases = tied_names(model)  # the same parameter as its first name, filled there
    with torch.no_grad():
        for name, target in named_state(model).items():
            if name in aliases:
                continue
            local, first = _local_rows(target, rank, world)
            for start, block in _blocks(target, rank, wire):
                dist.broadcast(block, src=0)
                if rank == 0:
                    continue
                if local is None:  # a whole tensor (a buffer, a scalar): every rank holds all of it
                    target.copy_(block)
                    continue
                low, high = max(start, first), min(start + len(block), first + len(local))
                if low < high:
                    local[low - first : high - first].copy_(block[low - start : high - start])
        for buffer in model.buffers():  # the ones outside the state dict too (rotary frequencies)
            on_wire = buffer.to(wire)
            dist.broadcast(on_wire, src=0)
            if rank != 0:
                buffer.copy_(on_wire)


def _local_rows(target: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor | None, int]:
    """A shard's local tensor and the first global row it holds; (None, 0) for a tensor held whole."""
    if not isinstance(target, DTensor) or target.dim() == 0:
        return None, 0
    per_rank = -(-target.shape[0] // world)
    return target.to_local(), min(rank * per_rank, target.shape[0])


def _blocks(target: torch.Tensor, rank: int, wire: torch.device) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) of `target` in blocks of at most BLOCK_BYTES: rank 0's own rows, the others'
    empty buffers to receive into. A 0-dim tensor is one block."""
    if target.dim() == 0:
        yield 0, (target.detach().to(wire) if rank == 0 else torch.empty((), dtype=target.dtype, device=wire))
        return
    rows = target.shape[0]
    row_bytes = max(1, math.prod(target.shape[1:]) * target.element_size())  # shapes only: DTensors too
    step = max(1, BLOCK_BYTES // row_bytes)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        if rank == 0:
            yield start, target.detach()[start:stop].to(wire).contiguous()
        else:
            yield start, torch.empty((stop - start, *target.shape[1:]), dtype=target.dtype, device=wire)
