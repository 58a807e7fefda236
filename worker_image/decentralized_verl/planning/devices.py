"""Where a role's workers run and how much memory one of them has: one `Placement` per node pool (pools of
one role can differ), the GPU's memory from `resources.gpuMemory` or the pool's `gpuType`. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from decentralized_verl.spec import NodePool, Resources, RoleSpec

GIB = 1024**3

GPU_MEMORY_GIB: dict[str, float] = {
    "h200": 141,
    "h100": 80,
    "h100-80gb": 80,
    "h100-94gb": 94,
    "h800": 80,
    "gh200": 96,
    "b200": 180,
    "a100": 80,
    "a100-80gb": 80,
    "a100-40gb": 40,
    "a800": 80,
    "l40s": 48,
    "l40": 48,
    "a6000": 48,
    "rtx6000-ada": 48,
    "a40": 48,
    "a10": 24,
    "a10g": 24,
    "l4": 24,
    "rtx4090": 24,
    "rtx3090": 24,
    "rtx5090": 32,
    "a5000": 24,
    "rtx4080": 16,
    "a4000": 16,
    "t4": 16,
    "v100": 16,
    "v100-16gb": 16,
    "v100-32gb": 32,
    "mi300x": 192,
    "mi250x": 128,
}
"""Memory of one GPU by `gpuType`, as these GPUs are sold (GiB; the planner counts usable memory as this).
`a100` and `h100` mean the 80 GB models; name `a100-40gb` for the other."""

_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (16Gi, 24G, 512Mi, 1e9 is not one) in bytes."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.groups()
    if suffix == "m":  # milli-bytes: legal, odd, rounded down
        return int(float(number) / 1000)
    return int(float(number) * _SUFFIXES[suffix or ""])


def gpu_type_bytes(gpu_type: str) -> int | None:
    """A known GPU type's memory in bytes; None for a type this table does not know."""
    key = gpu_type.strip().lower().replace("_", "-").replace(" ", "-")
    gib = GPU_MEMORY_GIB.get(key) or GPU_MEMORY_GIB.get(key.removeprefix("nvidia-"))
    return int(gib * GIB) if gib is not None else None


@dataclass(frozen=True)
class Capacity:
    """One kind of memory one worker has, and the manifest field a person changes to give it more."""

    bytes: int | None
    """None: not known (nothing in the manifest says)."""
    field: str
    source: str
    """How it was found, in words: `gpuMemory 24Gi`, `gpuType rtx4090`, `unknown gpuType 'x'`."""


@dataclass(frozen=True)
class Placement:
    """A role's workers that share one node pool (or the role's own resources when it has no pools)."""

    role: str
    replicas: int
    pool: str | None
    field: str
    """The pool's path (`spec.roles.learner.nodePools[1]`) or the role's (`spec.roles.learner`)."""
    gpus: int
    gpu: Capacity | None
    """None: a CPU worker (no GPUs, no GPU type, no GPU memory)."""
    host: Capacity

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None


def _gpu_capacity(
    resources: Resources, pool: NodePool | None, role: RoleSpec, where: str, role_where: str
) -> Capacity | None:
    if resources.gpu_memory is not None:
        return Capacity(
            quantity_bytes(resources.gpu_memory),
            f"{where}.resources.gpuMemory",
            f"gpuMemory {resources.gpu_memory}",
        )
    if pool is not None and pool.gpu_type:
        known = gpu_type_bytes(pool.gpu_type)
        if known is not None:
            return Capacity(known, where, f"gpuType {pool.gpu_type}")
        if role.resources.gpu_memory is None:
            return Capacity(None, f"{where}.gpuType", f"unknown gpuType {pool.gpu_type!r}")
    if role.resources.gpu_memory is not None:
        return Capacity(
            quantity_bytes(role.resources.gpu_memory),
            f"{role_where}.resources.gpuMemory",
            f"gpuMemory {role.resources.gpu_memory}",
        )
    if resources.gpus > 0:
        return Capacity(None, f"{where}.resources.gpuMemory", "GPU memory not given")
    return None


def placements(name: str, role: RoleSpec) -> list[Placement]:
    """One placement per node pool (a pool's `resources` replace the role's, as the workers get them),
    or one for the whole role; none for a role that runs inside the learner (replicas 0)."""
    role_where = f"spec.roles.{name}"
    slots: list[tuple[NodePool | None, int, str]] = (
        [(pool, pool.replicas, f"{role_where}.nodePools[{i}]") for i, pool in enumerate(role.node_pools)]
        if role.node_pools
        else [(None, role.replicas, role_where)]
    )
    out = []
    for pool, replicas, where in slots:
        if replicas == 0:
            continue
        resources = pool.resources if pool is not None and pool.resources is not None else role.resources
        memory = resources.memory
        host = Capacity(
            quantity_bytes(memory) if memory else None,
            f"{where}.resources.memory",
            f"memory {memory}" if memory else "memory not given",
        )
        out.append(
            Placement(
                role=name,
                replicas=replicas,
                pool=pool.name if pool is not None else None,
                field=where,
                gpus=resources.gpus,
                gpu=_gpu_capacity(resources, pool, role, where, role_where),
                host=host,
            )
        )
    return out


GPU_PRIORS = {"h100": 4.0, "h200": 4.5, "a100": 3.0, "l40s": 2.0, "rtx4090": 2.0, "a10": 1.0, "t4": 0.5}
"""A GPU type's relative rollout throughput, the dispatcher's weight for a worker before anything is
measured; measurements replace it after the first step."""
