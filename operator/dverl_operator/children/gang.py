"""Gang scheduling: the PodGroup that makes the scheduler place a job's pods all together or not at all,
and the marks that put each pod in it. Pure.

Two schedulers are spoken: scheduler-plugins' coscheduling (`scheduling.x-k8s.io/v1alpha1`, pods carry
the `scheduling.x-k8s.io/pod-group` label) and Volcano (`scheduling.volcano.sh/v1beta1`, pods carry the
`scheduling.k8s.io/group-name` annotation). The gang's members are the pods the job cannot start
without: every learner rank and serving role, and `minRollout` rollout replicas (all by default);
volunteers are never pods, so never members. The group follows scale and goes away on suspend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decentralized_verl.planning.plan import Plan, PlannedWorker
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.scheduling import GangSpec
from dverl_operator.objects import owned, quantity
from dverl_operator.objects.pod_state import pod_deleting, pod_phase

COSCHEDULING = "coscheduling"
VOLCANO = "volcano"
API_VERSIONS = {COSCHEDULING: "scheduling.x-k8s.io/v1alpha1", VOLCANO: "scheduling.volcano.sh/v1beta1"}
KIND_KEYS = {COSCHEDULING: "PodGroup.scheduling.x-k8s.io", VOLCANO: "PodGroup.scheduling.volcano.sh"}
"""How the API client names each PodGroup kind (two groups serve a kind called PodGroup)."""
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
SCHEDULER_NAMES = {COSCHEDULING: "scheduler-plugins-scheduler", VOLCANO: "volcano"}
"""The scheduler each gang needs when the spec names none (their installs' defaults)."""
DEFAULT_TIMEOUT_SECONDS = 60
GPU_RESOURCE = "nvidia.com/gpu"

Patch = tuple[str, str, dict[str, Any]]


def group_name(job: str) -> str:
    return job


def members(plan: Plan, gang: GangSpec) -> list[PlannedWorker]:
    """The pods that must be placed together, in plan order (learners first)."""
    keep = gang.min_rollout
    return [w for w in plan.workers if w.role != "rollout" or keep is None or w.index < keep]


def min_resources(workers: list[PlannedWorker]) -> dict[str, str]:
    """The members' requests added up: what the scheduler must find free before it places any of them."""
    out: dict[str, str] = {}
    cpu = quantity.total(w.cpu for w in workers)
    memory = quantity.total(w.memory for w in workers)
    gpus = sum(w.gpus for w in workers)
    if cpu:
        out["cpu"] = quantity.render_cpu(cpu)
    if memory:
        out["memory"] = quantity.render_bytes(memory)
    if gpus:
        out[GPU_RESOURCE] = str(gpus)
    return out


def pod_group(owner: owned.Owner, spec: JobSpec, plan: Plan) -> dict[str, Any] | None:
    """The job's PodGroup for the gang's scheduler; None when the spec asks for no gang."""
    gang = spec.scheduling.gang
    if gang is None:
        return None
    gang_members = members(plan, gang)
    body: dict[str, Any] = {"minMember": len(gang_members)}
    resources = min_resources(gang_members)
    if resources:
        body["minResources"] = resources
    if gang.scheduler == COSCHEDULING:
        body["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds or DEFAULT_TIMEOUT_SECONDS
    else:
        if gang.queue:
            body["queue"] = gang.queue
        if spec.priority_class_name:
            body["priorityClassName"] = spec.priority_class_name
    return {
        "apiVersion": API_VERSIONS[gang.scheduler],
        "kind": "PodGroup",
        "metadata": owned.metadata(owner, group_name(owner.name), owned.job_labels(owner.name)),
        "spec": body,
    }


def pod_marks(spec: JobSpec, job: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod in the job's gang."""
    gang = spec.scheduling.gang
    if gang is None:
        return {}, {}
    if gang.scheduler == COSCHEDULING:
        return {COSCHEDULING_LABEL: group_name(job)}, {}
    return {}, {VOLCANO_ANNOTATION: group_name(job)}


def scheduler_name(spec: JobSpec) -> str | None:
    """The spec's scheduler, else the gang's own (a gang is only honoured by the scheduler that knows it)."""
    if spec.scheduler_name:
        return spec.scheduler_name
    gang = spec.scheduling.gang
    return SCHEDULER_NAMES[gang.scheduler] if gang is not None else None


def sync(
    observed: Mapping[str, Mapping[str, Any] | None], want: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], list[Patch], list[tuple[str, str]]]:
    """(create, patch, delete) bringing the job's PodGroups to `want`: one of the wanted scheduler (read
    from its apiVersion), none of any other (a job moved from one scheduler to the other, suspended or
    finished). `observed` holds the PodGroups of the schedulers this operator may touch."""
    scheduler = _scheduler_of(want)
    create: list[dict[str, Any]] = []
    patch: list[Patch] = []
    delete: list[tuple[str, str]] = []
    for name, existing in observed.items():
        if existing is None or pod_deleting(existing):
            continue
        if want is None or name != scheduler:
            delete.append((KIND_KEYS[name], existing["metadata"]["name"]))
        elif _drifted(existing.get("spec") or {}, want["spec"]):
            patch.append((KIND_KEYS[name], existing["metadata"]["name"], {"spec": dict(want["spec"])}))
    if want is not None and observed.get(scheduler) is None:
        create.append(dict(want))
    return create, patch, delete


def _scheduler_of(group: Mapping[str, Any] | None) -> str | None:
    if group is None:
        return None
    return next(name for name, version in API_VERSIONS.items() if version == group["apiVersion"])


def _drifted(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """The fields we set differ (a scheduler may default others: those are its own)."""
    return any(have.get(key) != value for key, value in want.items())


def placed(pod: Mapping[str, Any]) -> bool:
    """Bound to a node (or already past it)."""
    if (pod.get("spec") or {}).get("nodeName") or pod_phase(pod) != "Pending":
        return True
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions)


def held(pods: Mapping[str, Mapping[str, Any]], spec: JobSpec, plan: Plan) -> tuple[str, str] | None:
    """(reason, message) while the gang scheduler still holds the job: fewer than minMember placed."""
    gang = spec.scheduling.gang
    if gang is None:
        return None
    need = len(members(plan, gang))
    have = sum(1 for pod in pods.values() if not pod_deleting(pod) and placed(pod))
    if have >= need:
        return None
    return "WaitingForGang", f"{have}/{need} of the gang placed by the {gang.scheduler} scheduler"
