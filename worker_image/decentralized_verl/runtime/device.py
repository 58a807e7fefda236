"""The process's device: the torch half of the package's one device home (the decision is
`runtime/device_choice.py`, torch-free).

A worker's entry calls `enter` once, before anything else touches CUDA: it resolves the device from the
role's resources, what the process sees and the override, calls `set_device` for a GPU, and records it.
Code below then asks `process_device()` or is handed the device; process groups come from
`init_process_group` with the device's backend (`cpu:gloo,cuda:nccl` on a GPU, gloo on a CPU), so a CPU
and a GPU run take the same code. Nothing else in the package names a device kind, calls `torch.cuda` or
names a backend (tests/unit/test_device_home.py holds every other module to it).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from decentralized_verl.runtime.device_choice import (
    ACCELERATOR,
    CPU,
    DeviceChoice,
    DeviceError,
    resolve_device,
)

__all__ = [
    "DeviceChoice",
    "DeviceError",
    "collective_device",
    "enter",
    "gpu_count",
    "gpu_name",
    "init_process_group",
    "memory_allocated",
    "pin_for_device",
    "process_device",
    "synchronize",
    "to_device",
]

log = logging.getLogger(__name__)

_chosen = DeviceChoice(CPU, reason="no worker entry chose a device (the CPU)")


def gpu_count() -> int:
    """GPUs this process's torch sees (0 on a CPU build, never initialising CUDA for a CPU one)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_memory_bytes() -> int | None:
    """Memory of this machine's first GPU (None without one): the machine `dverl run` lays a job out on."""
    return int(torch.cuda.get_device_properties(0).total_memory) if gpu_count() else None


def gpu_name() -> str:
    """`cuda:<name> xN` of the GPUs here, or `cpu`: what a volunteer announces."""
    count = gpu_count()
    return f"{ACCELERATOR}:{torch.cuda.get_device_name(0)} x{count}" if count else CPU


def enter(
    *,
    override: str = "auto",
    gpus: int = 0,
    visible: str | None = None,
    local_rank: int = 0,
    field: str = "device",
) -> torch.device:
    """Choose this process's device once, at its entry, and make it current (`set_device` before any
    other CUDA use, as NCCL and the caching allocator need). Returns it; `process_device()` returns it
    from then on."""
    global _chosen
    choice = resolve_device(
        override=override, gpus=gpus, visible=visible, local_rank=local_rank, counted=gpu_count(), field=field
    )
    if choice.is_gpu:
        torch.cuda.set_device(choice.index or 0)
    _chosen = choice
    log.info("device %s: %s", choice.name, choice.reason)
    return torch.device(choice.name)


def choice() -> DeviceChoice:
    """The decision `enter` made (the CPU before it): its kind, index and reason."""
    return _chosen


def process_device() -> torch.device:
    """The device this process computes on."""
    return torch.device(_chosen.name)


def to_device(module: nn.Module, device: torch.device | str | None = None) -> nn.Module:
    """`module` on `device` (default: the process's), in place, returned."""
    return module.to(device if device is not None else process_device())


def init_process_group(world: int, rank: int, *, init_method: str | None = None, store=None) -> None:
    """Join a process group with the backend of this process's device."""
    backend = _chosen.backend
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)


def collective_device() -> torch.device:
    """Where a collective's tensors go: the process's device (the group's backend matches it)."""
    return process_device()


def synchronize() -> None:
    """Wait for the process's GPU work to finish (timings); nothing on a CPU."""
    if _chosen.is_gpu and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def memory_allocated() -> int:
    """Bytes of GPU memory this process's tensors hold now; 0 on a CPU. What each worker reports in its
    status so the GPU check can tell that every role really is on its GPU."""
    return int(torch.cuda.memory_allocated()) if _chosen.is_gpu else 0


def max_memory_allocated() -> int:
    """The peak of `memory_allocated` since the process began; 0 on a CPU."""
    return int(torch.cuda.max_memory_allocated()) if _chosen.is_gpu else 0


def pins_memory() -> bool:
    """Whether host staging buffers should be pinned: only for copies to and from a GPU."""
    return _chosen.is_gpu


def pin_for_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in page-locked memory when this process copies to and from a GPU, else itself."""
    return tensor.pin_memory() if pins_memory() else tensor


def empty_cache() -> None:
    """Hand cached, unused GPU blocks back (a colocated role sleeping); nothing on a CPU."""
    if _chosen.is_gpu:
        torch.cuda.empty_cache()
