"""How a training role holds its model: whole on every replica (ddp) or split over the replicas (FSDP2),
optionally recomputing each decoder layer's activations in the backward pass; and the full weights of a
split model, gathered one tensor at a time.

FSDP2 (`fully_shard`) shards every decoder layer as its own unit, then the root: a layer's parameters
are all-gathered just before it runs and freed after, so a rank holds 1/world of the parameters,
gradients and optimizer state plus one gathered layer. The root must be the module whose `forward` the
training step calls. The trainer's shared-prompt forward (`core.forward`) calls the decoder and the LM
head separately, never the causal LM's own forward, so the trainer shards its `PolicyForward` (which
holds the model) rather than the model: the root's hooks then gather the embeddings, final norm and LM
head (tied or not: they stay in one unit) around each training call.

Activation checkpointing here is our own, not Hugging Face's `gradient_checkpointing_enable`: HF drops
the key/value cache of a checkpointed layer (a layer that writes the cache would write it twice when the
backward pass replays it), which would break the shared-prompt forward's prompt cache. Each layer's cache
entry is saved before the layer runs and put back before the replay, so the replay sees what the first
run saw and writes the same keys and values.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint
from transformers import Cache

from decentralized_verl.runtime import device

SHARDINGS = ("ddp", "fsdp")
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
"""Prefixes module wrappers put into parameter names; the unsharded model's names have none."""


def shard_model(
    model: nn.Module,
    *,
    sharding: str,
    world: int,
    dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """`model` made ready for training in place and returned (the same object).

    ddp: only activation checkpointing (the caller wraps the model in DistributedDataParallel as before).
    fsdp: every decoder layer, then `model` itself, sharded over a `world`-rank mesh of the model's device
    type (gloo on CPU, nccl on GPU; a one-rank process group is made when none exists). Parameters keep
    the model's dtype; a bf16/fp16 model's gradients are reduced in fp32. cpu_offload keeps the shards,
    their gradients and so the optimizer state in CPU memory.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: must be one of {SHARDINGS} (got {sharding!r})")
    if cpu_offload and sharding != "fsdp":
        raise ValueError("cpu_offload: needs sharding 'fsdp'")
    layers = decoder_layers(model) if activation_checkpointing or sharding == "fsdp" else []
    if activation_checkpointing:
        for layer in layers:
            checkpoint_layer(layer)
    if sharding == "ddp":
        return model

    param = next(model.parameters())
    dtype = dtype or param.dtype
    device_type = device.process_device().type  # the mesh is the worker's device, whatever was loaded where
    _ensure_process_group(world, device_type)
    mesh = init_device_mesh(device_type, (world,))
    # Inputs are left as the model gets them: casting the root's floating inputs would round the batch.
    precision = MixedPrecisionPolicy(
        param_dtype=dtype,
        reduce_dtype=torch.float32 if dtype in (torch.bfloat16, torch.float16) else None,
        cast_forward_inputs=False,
    )
    offload = CPUOffloadPolicy(pin_memory=device.pins_memory()) if cpu_offload else OffloadPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=precision, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=precision, offload_policy=offload)
    if param.is_meta:  # built without weights (`training.rank0_weights`): shards get storage, unfilled
        model.to_empty(device="cpu" if cpu_offload else device_type)
    retie_embeddings(model)
    return model


def retie_embeddings(model: nn.Module) -> None:
    """A model whose config ties its input embeddings and LM head holds one tensor for both again after
    sharding and `to_empty` (which may give each name its own storage); a no-op when they are one."""
    lm = getattr(model, "model", model)  # the trainer's PolicyForward holds the causal LM
    config = getattr(lm, "config", None)
    if not getattr(config, "tie_word_embeddings", False) or not hasattr(lm, "get_output_embeddings"):
        return
    head, embeddings = lm.get_output_embeddings(), lm.get_input_embeddings()
    if head is not None and embeddings is not None and head.weight is not embeddings.weight:
        head.weight = embeddings.weight


def _ensure_process_group(world: int, device_type: str) -> None:
    """FSDP needs a process group even for one replica (CPU offload on one GPU); make that one here."""
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise ValueError(
                f"world: the process group has {dist.get_world_size()} ranks, sharding asked for {world}"
            )
        return
    if world != 1:
        raise ValueError(f"world: {world} ranks need torch.distributed initialised first (init_distributed)")
    device.init_process_group(1, 0, store=dist.HashStore())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated decoder blocks: modules of the classes Hugging Face models name in
    `_no_split_modules` (what its own FSDP wrapping uses), else the longest list of same-class modules."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names or _base_name(m) in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len({type(x) for x in m}) == 1]
    if not lists:
        raise ValueError(f"model: no decoder layers found in {type(model).__name__}")
    return list(max(lists, key=len))


def _base_name(module: nn.Module) -> str:
    """The class name before wrappers (FSDP's `FSDPLlamaDecoderLayer`, ours) subclassed it."""
    for cls in type(module).__mro__:
        if not cls.__name__.startswith(("FSDP", "Checkpointed")):
            return cls.__name__
    return type(module).__name__


def checkpoint_layer(layer: nn.Module) -> None:
    """Recompute `layer`'s activations in the backward pass (training with gradients only).

    The layer's class is swapped for a subclass whose `forward` runs under non-reentrant
    `torch.utils.checkpoint`: hooks on the module (FSDP's gather) stay outside the checkpoint, names and
    state_dict keys do not change, and a deep copy stays checkpointed."""
    cls = type(layer)
    if not getattr(cls, "_dverl_checkpointed", False):
        layer.__class__ = _checkpointed_class(cls)


@functools.cache
def _checkpointed_class(cls: type) -> type:
    base_forward = cls.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return base_forward(self, *args, **kwargs)
        caches = [value for value in kwargs.values() if _is_cache(value)]
        saved = [_cache_state(cache) for cache in caches]

        def run(*inner: Any) -> Any:
            for cache, state in zip(caches, saved, strict=True):
                _restore_cache(cache, state)
            return base_forward(self, *inner, **kwargs)

        return checkpoint(run, *args, use_reentrant=False)

    return type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward, "_dverl_checkpointed": True})


def _is_cache(value: Any) -> bool:
    return isinstance(value, Cache)


def _cache_state(cache: Any) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
    """What a layer's run can change in a Hugging Face cache: its attributes, its list of per-layer
    entries and each entry's attributes (updates rebind tensors, they do not write into them)."""
    layers = list(getattr(cache, "layers", []))
    return dict(vars(cache)), layers, [dict(vars(layer)) for layer in layers]


def _restore_cache(cache: Any, state: tuple[dict[str, Any], list[Any], list[dict[str, Any]]]) -> None:
    attributes, layers, layer_attributes = state
    vars(cache).clear()
    vars(cache).update(attributes)
    if hasattr(cache, "layers"):
        cache.layers[:] = layers
    for layer, saved in zip(layers, layer_attributes, strict=True):
        vars(layer).clear()
        vars(layer).update(saved)


def is_sharded(model: nn.Module) -> bool:
    """Whether any of the model's parameters is a DTensor shard (FSDP2), so reading weights is collective."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def full_state_dict(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full CPU tensor) for every entry of the model's state_dict, in its order, under the plain
    model's names (tied weights under both names, as `state_dict()` has them).

    For a sharded model this is collective: every rank must iterate it to the end. Each tensor is
    gathered when its turn comes and handed over; at most one gathered tensor is held here at a time, so
    a caller that sends or discards each one never holds the whole model. Unsharded models yield their
    tensors as they are (moved to the CPU)."""
    items = named_state(model)
    for name in items:
        yield name, full_cpu(items[name])


def gathered_digest(model: nn.Module) -> str:
    """sha256 over the full tensors in name order: equal to `training.distributed.weights_digest` of the
    same weights unsharded (collective for a sharded model)."""
    items = named_state(model)
    digest = hashlib.sha256()
    for name in sorted(items):
        digest.update(name.encode())
        digest.update(full_cpu(items[name]).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def plain_name(name: str) -> str:
    """A parameter's name in the unsharded model (module wrappers' prefixes removed)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def named_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict's (sharded) tensors under the unsharded model's names; nothing is gathered."""
    return {plain_name(name): value for name, value in model.state_dict().items()}


def tied_names(model: nn.Module) -> dict[str, str]:
    """Parameters registered under more than one name (tied embeddings): alias -> first name. Decided by
    parameter identity, so every rank finds the same ties whatever its shards hold."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), plain_name(name))
        if owner != plain_name(name):
            tied[plain_name(name)] = owner
    return tied


def full_cpu(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU: a DTensor shard is all-gathered (from the CPU shard of an offloaded
    model, copied to the mesh's device first, since the collective runs there)."""
    value = value.detach()
    if isinstance(value, DTensor):
        mesh = value.device_mesh
        local = value.to_local()
        if local.device.type != mesh.device_type:
            on_device = local.to(mesh.device_type)
            value = DTensor.from_local(
                on_device, mesh, value.placements, shape=value.shape, stride=value.stride()
            )
        value = value.full_tensor()
    return value.cpu()
