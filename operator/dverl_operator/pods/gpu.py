"""Pure: what a GPU worker's pod carries beyond the GPUs it requests, so the worker finds its device and
its gang talks NCCL: the device plugin exposes the pod's GPUs (the worker then picks by LOCAL_RANK, see
`decentralized_verl/runtime/device_choice.py`); NCCL's socket interface, which a person may set through
the role's podTemplate env (the template's value wins); and a memory-backed /dev/shm large enough for
NCCL's and the engines' shared buffers (the 64 MiB container default is not).

Called by `pods/build.py` for every worker; a worker without GPUs gets nothing from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from decentralized_verl.planning.plan import PlannedWorker
from decentralized_verl.spec import JobSpec

NCCL_INTERFACE = "NCCL_SOCKET_IFNAME"
NCCL_DEFAULT_INTERFACE = "^lo,docker"
"""NCCL's own exclusion syntax: any interface but loopback and Docker's bridges (the pod network's)."""
SHM_PER_GPU_MIB = 2048
"""/dev/shm per GPU at least: NCCL's intra-node buffers and a vLLM engine's shared memory."""


@dataclass(frozen=True)
class GpuPodAdditions:
    env: dict[str, str] = field(default_factory=dict)
    shm_floor_mib: int = 0
    """The smallest /dev/shm this pod should get (0: no floor)."""


def gpu_pod_additions(spec: JobSpec, worker: PlannedWorker) -> GpuPodAdditions:
    """The env and /dev/shm floor of `worker`'s pod when it computes on GPUs; nothing otherwise (no GPUs,
    or a role the spec keeps on the CPU)."""
    role = getattr(spec.roles, "rollout" if worker.role == "span" else worker.role, None)
    if worker.gpus == 0 or (role is not None and role.device == "cpu"):
        return GpuPodAdditions()
    template = role.pod_template if role is not None else None
    named = {e.get("name") for e in (template.spec.env if template is not None else [])}
    env = {} if NCCL_INTERFACE in named else {NCCL_INTERFACE: NCCL_DEFAULT_INTERFACE}  # theirs is merged in
    return GpuPodAdditions(env=env, shm_floor_mib=SHM_PER_GPU_MIB * worker.gpus)
