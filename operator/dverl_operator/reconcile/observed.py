"""What one reconcile pass sees: the RLHFJob, its children as read from the API, the coordinator's
progress and the clock. Filled in by the loop's I/O side; `decide` reads nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.core.status import JobStatus


@dataclass(frozen=True)
class Observed:
    job: Mapping[str, Any]
    """The RLHFJob as read from the API (metadata, spec, status)."""
    pods: Mapping[str, Mapping[str, Any]]
    config_map: Mapping[str, Any] | None
    service: Mapping[str, Any] | None
    progress: JobStatus | None
    now: float
    gateway: Mapping[str, Any] | None = None
    """The volunteer gateway Service, when one exists."""
    policies: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None)
    """The job's NetworkPolicy and its gateway NetworkPolicy, when they exist."""
    credentials_ready: bool = False
    """The job's credentials Secret is known to exist (this operator made or met it recently)."""
    pod_groups: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """The job's PodGroup under each gang scheduler this operator may manage (None where absent)."""
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    """The labels of the job's namespace (its Pod Security enforce label is what `decide` reads)."""
