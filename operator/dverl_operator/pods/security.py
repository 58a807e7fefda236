"""Pure: what makes a worker pod admissible under the Pod Security "restricted" profile, and the pod
settings that follow from its role: the security contexts, the writable scratch volumes a read-only root
filesystem needs, /dev/shm sized for the role, and a termination grace period that fits a checkpoint.

Workers run as the image's user (Dockerfile `USER 10001:10001`); nothing they do needs a capability, a
privilege escalation or the API server (the operator does all the talking to Kubernetes).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from decentralized_verl.planning.locate import model_shape
from decentralized_verl.planning.plan import PlannedWorker
from decentralized_verl.runtime.lifecycle import CALL_GRACE_S
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.pod_security import (  # the restricted settings live with the checker
    WORKER_GID,
    WORKER_UID,
    container_security_context,
    hardened,
    pod_security_context,
)
from decentralized_verl.spec.source_paths import HOME_DIR, SHM_DIR, TMP_DIR
from dverl_operator.objects import quantity

__all__ = [
    "WORKER_GID",
    "WORKER_UID",
    "container_security_context",
    "grace_seconds",
    "hardened",
    "pod_security_context",
    "scratch",
    "shm_size",
]

SHM_DEFAULT = "1Gi"
SHM_FLOOR = Decimal(64 * 2**20)
SHM_SHARE = Decimal(1) / 4
"""/dev/shm gets a quarter of the worker's memory (it counts against the memory limit), or 1Gi when the
role sets no memory: enough for torch DataLoader workers and NCCL's shared-memory transport."""

SERVING_GRACE_S = int(CALL_GRACE_S) + 10
"""A rollout, reward, reference or critic worker finishes the calls in flight and leaves."""
LEARNER_BASE_GRACE_S = 60
CHECKPOINT_WRITE_BYTES_PER_S = 100 * 2**20
"""A conservative network-volume write speed, for the learner's last checkpoint."""
LEARNER_GRACE_UNKNOWN_S = 600
"""The learner's grace when its model's size is not known here (a model read from a volume)."""
LEARNER_GRACE_MAX_S = 3600
STATE_BYTES_PER_PARAMETER = 16
"""fp32 weights + Adam's two moments + slack for the rest of a checkpoint."""


def shm_size(worker: PlannedWorker, floor_mib: int = 0) -> str:
    if not worker.memory and not floor_mib:
        return SHM_DEFAULT
    share = max(SHM_FLOOR, quantity.parse(worker.memory) * SHM_SHARE) if worker.memory else 0
    mebibytes = max(int(share / 2**20), floor_mib)
    return f"{mebibytes}Mi"


def scratch(
    worker: PlannedWorker, *, shm_floor_mib: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) that the read-only root filesystem leaves writable: a memory /dev/shm (at least
    `shm_floor_mib`, a GPU pod's), /tmp and the image's home (its working directory, caches, `runs/`
    output when no checkpoint volume is set)."""
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(worker, shm_floor_mib)}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    mounts = [
        {"name": "dshm", "mountPath": SHM_DIR},
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "home", "mountPath": HOME_DIR},
    ]
    return volumes, mounts


def grace_seconds(spec: JobSpec, worker: PlannedWorker) -> int:
    """How long Kubernetes waits between SIGTERM and SIGKILL: long enough for the learner to write its last
    checkpoint (its state's size at a slow volume's speed), a short while for a serving worker."""
    if worker.role != "learner":
        return SERVING_GRACE_S
    if spec.training.checkpoint.every == 0:
        return SERVING_GRACE_S
    shape = model_shape(spec.model, None).shape
    if shape is None:
        return LEARNER_GRACE_UNKNOWN_S
    state = shape.parameters() * STATE_BYTES_PER_PARAMETER
    sharding = spec.roles.learner.replicas if spec.roles.learner.sharding == "fsdp" else 1
    seconds = LEARNER_BASE_GRACE_S + state // (sharding * CHECKPOINT_WRITE_BYTES_PER_S)
    return int(min(LEARNER_GRACE_MAX_S, seconds))
