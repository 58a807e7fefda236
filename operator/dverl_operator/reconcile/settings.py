"""The reconcile policy, read once from the command line at the entry and passed down (nothing below the
entry reads flags or the environment)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from dverl_operator.children.guard import PolicyScope


def _release() -> str:
    try:
        return version("decentralized-verl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "latest"


DEFAULT_WORKER_IMAGE = f"ghcr.io/dverl/dverl-worker:{_release()}"
"""The chart's worker image at this release (charts/dverl/values.yaml `workerImage`, its tag the chart's
appVersion): what an operator started without DVERL_WORKER_IMAGE or --worker-image puts into pods."""


@dataclass(frozen=True)
class Settings:
    default_image: str = DEFAULT_WORKER_IMAGE
    backoff_base_seconds: float = 10.0
    backoff_max_seconds: float = 300.0
    resync_seconds: float = 10.0
    volunteer_gateway: bool = False
    """Expose each volunteer job's DHT bootstrap peer outside the cluster (chart: volunteers.gateway)."""
    volunteer_service_type: str = "LoadBalancer"
    network_policy: PolicyScope | None = None
    """Who may reach a job's pods besides its own (the operator); None: no NetworkPolicies (chart:
    networkPolicy.enabled=false, for clusters without a policy engine)."""
    gang_schedulers: frozenset[str] = frozenset()
    """Gang schedulers whose PodGroups this operator may manage (chart: gangScheduling.<name>, which
    grants the RBAC); a job asking for another is refused by field."""
    service_accounts: frozenset[str] = frozenset()
    """ServiceAccounts a job's podTemplate may give its pods (chart: podTemplate.serviceAccountNames);
    any other is refused by field, so holding the RLHFJob edit role never lends a pod another account."""


GATEWAY_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
