"""Pure: everything a job should have in the cluster, given its (valid) spec and plan: the ConfigMap, the
Services, one pod per worker and the guards, assembled from the children and pods rooms."""

from __future__ import annotations

from decentralized_verl.planning.plan import Plan
from decentralized_verl.spec import JobSpec
from dverl_operator.children.config_map import config_map
from dverl_operator.children.guard import PolicyScope, gateway_policy, network_policy
from dverl_operator.children.job_children import Children
from dverl_operator.children.services import addresses, gateway_service, service
from dverl_operator.objects.owned import Owner
from dverl_operator.pods.build import pod
from dverl_operator.pods.marks import PodMarks


def for_job(
    owner: Owner,
    spec: JobSpec,
    plan: Plan,
    image: str,
    *,
    gateway_type: str | None = None,
    policy: PolicyScope | None = None,
    marks: PodMarks = PodMarks(),
) -> Children:
    """`gateway_type` is the volunteer gateway's Service type, None when the chart does not expose
    gateways; `policy` None when the chart turns NetworkPolicies off. (The credentials Secret is random,
    so it is issued where it is applied, not here.)"""
    addrs = addresses(owner, plan)
    pods = {w.name: pod(owner, spec, plan, w, image, addrs, marks) for w in plan.workers}
    gateway = gateway_service(owner, plan, gateway_type) if gateway_type else None
    return Children(
        config_map=config_map(owner, spec, plan),
        service=service(owner, plan),
        pods=pods,
        gateway=gateway,
        network_policy=network_policy(owner, plan, policy) if policy is not None else None,
        gateway_policy=gateway_policy(owner, plan) if policy is not None and gateway is not None else None,
    )
