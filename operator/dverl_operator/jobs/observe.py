"""Read one RLHFJob and its children from the API: what `decide` needs besides the coordinator's progress,
the clock and whether the job's credentials are known to exist (the loop adds those)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from decentralized_verl.spec import KIND
from dverl_operator.children import gang, guard
from dverl_operator.children.config_map import config_map_name
from dverl_operator.children.services import gateway_name, service_name
from dverl_operator.kube.client import Cluster
from dverl_operator.objects.owned import LABEL_JOB
from dverl_operator.reconcile.observed import Observed
from dverl_operator.reconcile.settings import Settings


async def observe(cluster: Cluster, settings: Settings, namespace: str, name: str) -> Observed | None:
    """The job and its children as the API has them now; None when the job is gone."""
    job = await cluster.get(KIND, namespace, name)
    if job is None:
        return None
    policies = settings.network_policy is not None
    pods, config_map, service, gateway, policy, gateway_policy, labels = await asyncio.gather(
        cluster.list("Pod", namespace, {LABEL_JOB: name}),
        cluster.get("ConfigMap", namespace, config_map_name(name)),
        cluster.get("Service", namespace, service_name(name)),
        cluster.get("Service", namespace, gateway_name(name)),
        _maybe_get(cluster, policies, "NetworkPolicy", namespace, guard.network_policy_name(name)),
        _maybe_get(cluster, policies, "NetworkPolicy", namespace, guard.gateway_policy_name(name)),
        cluster.namespace_labels(namespace),
    )
    return Observed(
        job=job,
        pods={p["metadata"]["name"]: p for p in pods},
        config_map=config_map,
        service=service,
        progress=None,
        now=time.time(),
        gateway=gateway,
        policies=(policy, gateway_policy),
        pod_groups=await _pod_groups(cluster, settings, namespace, name),
        namespace_labels=labels,
    )


async def _pod_groups(
    cluster: Cluster, settings: Settings, namespace: str, name: str
) -> dict[str, dict[str, Any] | None]:
    """The job's PodGroup under each gang scheduler the chart enabled (and granted access to)."""
    schedulers = sorted(settings.gang_schedulers)
    found = await asyncio.gather(
        *(cluster.get(gang.KIND_KEYS[s], namespace, gang.group_name(name)) for s in schedulers)
    )
    return dict(zip(schedulers, found, strict=True))


async def _maybe_get(
    cluster: Cluster, wanted: bool, kind: str, namespace: str, name: str
) -> dict[str, Any] | None:
    """With NetworkPolicies turned off the operator is granted no access to them: it does not look
    (policies it made earlier stay until the job goes)."""
    return await cluster.get(kind, namespace, name) if wanted else None
