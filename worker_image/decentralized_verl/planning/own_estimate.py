"""One worker's own memory figures, picked from the job's plan: the estimate for its role in the node
pool its replica index lands in (pools in order, replicas filled pool by pool, as the pods are made).
Pure; the worker leaves the result as its termination message (core/memory_report.py)."""

from __future__ import annotations

from decentralized_verl.core.memory_report import MemoryEstimate
from decentralized_verl.planning.fit import MemoryPlan
from decentralized_verl.spec import JobSpec


def _pool_of(spec: JobSpec, role: str, index: int) -> str | None:
    """The node pool replica `index` of `role` runs in (None: the role has no pools)."""
    role_spec = getattr(spec.roles, role, None)
    seen = 0
    for pool in getattr(role_spec, "node_pools", None) or ():
        seen += pool.replicas
        if index < seen:
            return pool.name
    return None


def own_estimate(plan: MemoryPlan, spec: JobSpec, role: str, index: int) -> MemoryEstimate | None:
    """The planner's figures for replica `index` of `role`, or None when it has none (the model's shape
    unknown, a role it does not size). A verdict of "not checked" (no memory limit to check against, a
    GPU of unknown size) still carries the estimate."""
    pool = _pool_of(spec, role, index)
    for worker in plan.workers:
        if worker.role != role or worker.placement.pool != pool:
            continue  # a plan exists only for a role whose model's shape the planner found
        host = worker.estimate.host
        if host <= 0:
            return None
        gpu = worker.estimate.gpu if worker.placement.on_gpu and worker.estimate.gpu > 0 else None
        return MemoryEstimate(role, host, gpu)
    return None
