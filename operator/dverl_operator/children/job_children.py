"""The children a job wants in the cluster, as one value: what the reconcile assembles from the spec and
the sync compares with what it observed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Children:
    config_map: dict[str, Any]
    service: dict[str, Any]
    pods: dict[str, dict[str, Any]]
    """Keyed by pod name, in plan order (learners first)."""
    gateway: dict[str, Any] | None = None
    """The volunteer gateway Service (only for jobs with volunteers, when the chart enables gateways)."""
    network_policy: dict[str, Any] | None = None
    """Ingress to the job's pods from its own pods and the operator only (None: policies turned off)."""
    gateway_policy: dict[str, Any] | None = None
    """Ingress to the DHT bootstrap pod's port from anywhere (only beside a gateway and a policy)."""
