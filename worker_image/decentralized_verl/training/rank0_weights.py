"""Only rank 0 of a sharded group reads the model's weights; the others build it on the meta device (shapes,
no storage) and receive their shards from rank 0 once it is sharded.

Without this every rank loads the whole model before FSDP2 splits it, so each rank's peak memory is at
least the whole model even though it keeps 1/N. Here a rank > 0 never holds more than its shards: the
meta skeleton takes no memory, `sharding.shard_model` gives its shards storage (`to_empty`), and
`build_then_fill` has rank 0 broadcast its full tensors one at a time, each rank keeping its slice. Buffers
that are not in the state dict (rotary frequencies) are broadcast as they are. Rank 0 loads the whole model
as every rank did before, and sends before it shards, so its own peak is what it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")


def uses_rank0_load(sharded: bool, world: int) -> bool:
    return sharded and world > 1 and dist.is_initialized()


def load_for_rank(
    model_spec: Any, *, rank: int, meta: bool, field: str = "spec.model"
) -> tuple[nn.Module, Any]:
    """Rank 0 (or any rank when `meta` is False): the loaded model and tokenizer. Ranks > 0 with `meta`: the
    same architecture on the meta device, and the tokenizer."""
    from decentralized_verl.models.loading import load_model_and_tokenizer, load_tokenizer

    if not meta or rank == 0:
        return load_model_and_tokenizer(model_spec, field=field)
    tokenizer = load_tokenizer(model_spec, field=field)
    with torch.device("meta"):
        model = _skeleton(model_spec, tokenizer, field)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _skeleton(model_spec: Any, tokenizer: Any, field: str) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from decentralized_verl.models.loading import resolve_hf_dir, torch_dtype
    from decentralized_verl.models.tiny import build_tiny, tiny_config

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
    """One tensor at a time, in state-dict order (the same on every rank, sharded or not): rank 0 sends its
    whole tensor, every other rank receives it and copies its slice (FSDP2 shards dim 0 as `torch.chunk`
    does) into its shard, so none holds more than its shards and one whole tensor."""
    from torch.distributed.tensor import DTensor

    from decentralized_verl.training.sharding import named_state, tied_names

    rank, world = dist.get_rank(), dist.get_world_size()
    wire = "cuda" if dist.get_backend() == "nccl" else "cpu"
    aliases = tied_names(model)  # the same parameter as its first name, filled there
    with torch.no_grad():
        for name, target in named_state(model).items():
            if name in aliases:
                continue
            if rank == 0:
                dist.broadcast(target.detach().to(wire), src=0)
                continue
            full = torch.empty(target.shape, dtype=target.dtype, device=wire)
            dist.broadcast(full, src=0)
            if isinstance(target, DTensor):
                chunks = full.chunk(world, dim=0)
                target.to_local().copy_(chunks[rank] if rank < len(chunks) else full[:0])
            else:
                target.copy_(full)
            del full
        for buffer in model.buffers():  # the ones outside the state dict too (rotary frequencies)
            on_wire = buffer.to(wire)
            dist.broadcast(on_wire, src=0)
            if rank != 0:
                buffer.copy_(on_wire)
