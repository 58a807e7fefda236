"""Which device a process computes on: the pure half of the package's one device home.

Torch-free, so the plan, `dverl plan` and the operator read the same decision a worker makes at its entry
(`runtime/device.py`, the torch half, applies it). The decision takes three inputs and nothing else:
the role's resources in the plan (GPUs per worker), what the process can see (`CUDA_VISIBLE_DEVICES`, the
GPUs torch counts, `LOCAL_RANK`) and an explicit override (`roles.<role>.device`, `dverl worker
--device`). Code elsewhere is given a device; it never names one (a test greps the package).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from decentralized_verl.errors import DverlError

CPU = "cpu"
ACCELERATOR = "cuda"
DEVICE_CHOICES: tuple[str, ...] = ("auto", CPU, ACCELERATOR)
"""What `roles.<role>.device` and `--device` accept: auto (a GPU when the worker was given one and can see
it), cpu (always), cuda (a GPU or a loud error)."""
DeviceOverride = Literal["auto", "cpu", "cuda"]

GPU_BACKEND = "cpu:gloo,cuda:nccl"
"""A GPU process's group: CPU tensors reduce over gloo, GPU tensors over NCCL, so one code path serves
both and a stray CPU tensor in a collective never reaches NCCL."""
CPU_BACKEND = "gloo"
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource a pod asks GPUs with (the device plugin's name, not a device)."""


class DeviceError(DverlError):
    """A device that was asked for and cannot be had; the message names the setting that asked."""


@dataclass(frozen=True)
class DeviceChoice:
    """A process's device: its kind, the GPU's index among those the process sees, and why."""

    kind: Literal["cpu", "cuda"]
    index: int | None = None
    reason: str = ""

    @property
    def name(self) -> str:
        """`cpu` or `cuda:N`: what `torch.device` takes and what `dverl plan` prints."""
        return CPU if self.kind == CPU else f"{ACCELERATOR}:{self.index or 0}"

    @property
    def is_gpu(self) -> bool:
        return self.kind == ACCELERATOR

    @property
    def backend(self) -> str:
        """The process group backend for this device (mixed on a GPU)."""
        return GPU_BACKEND if self.is_gpu else CPU_BACKEND


def names_gpu(name: str) -> bool:
    """Whether a device name (`cpu`, `cuda`, `cuda:N`, a `torch.device`'s str) is a GPU."""
    return str(name).split(":", 1)[0] == ACCELERATOR


def visible_gpus(visible: str | None, counted: int) -> int:
    """How many GPUs the process may use: torch's count, capped by `CUDA_VISIBLE_DEVICES` when set
    (an empty or `-1` value hides them all, as CUDA reads it)."""
    if visible is None:
        return counted
    ids = [v for v in (part.strip() for part in visible.split(",")) if v]
    if not ids or ids[0].startswith("-"):
        return 0
    return min(len(ids), counted) if counted else 0


def resolve_device(
    *,
    override: str = "auto",
    gpus: int = 0,
    visible: str | None = None,
    local_rank: int = 0,
    counted: int = 0,
    field: str = "device",
) -> DeviceChoice:
    """The device of one process. `gpus`: GPUs the plan gave its worker (0 for a CPU worker; `None`-free
    since the spec defaults it). `counted`: GPUs torch sees. `local_rank`: the rank on this node, which
    picks the GPU when the process sees several (torchrun's convention; with one visible GPU per
    process it is that one). `field` names the setting in errors."""
    if override not in DEVICE_CHOICES and not _explicit_index(override):
        raise DeviceError(f"{field}: must be one of {', '.join(DEVICE_CHOICES)} (got {override!r})")
    here = visible_gpus(visible, counted)
    if override == CPU:
        return DeviceChoice(CPU, reason=f"{field} is cpu")
    if override == "auto" and gpus == 0:
        return DeviceChoice(CPU, reason="the role's workers were given no GPU")
    if here == 0:
        if override == "auto":
            return DeviceChoice(CPU, reason=f"the worker was given {gpus} GPU(s) but this process sees none")
        raise DeviceError(
            f"{field}: {override} asked for, but this process sees no GPU (CUDA_VISIBLE_DEVICES)"
        )
    index = int(override.split(":", 1)[1]) if _explicit_index(override) else local_rank % here
    if index >= here:
        raise DeviceError(f"{field}: {override} asked for, but this process sees {here} GPU(s)")
    return DeviceChoice(ACCELERATOR, index, reason=f"GPU {index} of {here} visible (local rank {local_rank})")


def _explicit_index(override: str) -> bool:
    head, _, tail = override.partition(":")
    return head == ACCELERATOR and tail.isdigit()


def planned_device(gpus: int, override: str, slot: int | None) -> str:
    """What `dverl plan` shows for a worker: `cpu`, or `cuda:N` on a machine whose GPU N it was placed on
    (`slot`), or `cuda` for a pod given `gpus` GPUs of a node the plan does not see."""
    if override == CPU or (override == "auto" and gpus == 0 and slot is None):
        return CPU
    if slot is None:
        return ACCELERATOR if gpus or override != "auto" else CPU
    return f"{ACCELERATOR}:{slot}"


def gpu_env(slots: tuple[int, ...]) -> dict[str, str]:
    """The environment a process placed on `slots` of a machine's GPUs starts with: the GPUs it may see
    (and so index from 0), or none."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(s) for s in slots) if slots else ""}
