"""Only rank 0 of a sharded group reads the model's weights; the others build it on the meta device (shapes,
no storage) and receive their shards from rank 0 once it is sharded.

Without this every rank loads the whole model before FSDP2 splits it, so each rank's peak memory is at
least the whole model even though it keeps 1/N. Here a rank > 0 never holds more than its shards: the
meta skeleton takes no memory, `sharding.shard_model` gives its shards storage (`to_empty`), and
`fill_from_rank0` broadcasts rank 0's full tensors one at a time, each rank keeping its slice
(`set_model_state_dict(..., broadcast_from_rank0=True)`). Buffers that are not in the state dict (rotary
frequencies) are broadcast as they are. Rank 0 keeps what the unsharded load gave it until the fill.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


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


def full_state(model: nn.Module, *, rank: int) -> dict[str, torch.Tensor]:
    """What rank 0 broadcasts: its unsharded state dict, taken before sharding (the others send nothing)."""
    return dict(model.state_dict()) if rank == 0 else {}


def fill_from_rank0(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Collective, after sharding: every rank's shards (and buffers) become rank 0's values."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=options)
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
