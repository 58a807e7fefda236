"""Pure: (the RLHFJob, its observed children, coordinator progress, the clock) -> what to do.

The handler gathers what is observed, calls `decide`, and applies the returned `Actions`. All policy
lives here, where tests can reach it: validation, refusing learner-breaking changes while running,
suspend, scale, restart counting with exponential backoff, learner gang restarts, phase and conditions.
Every decision is a function of the observed state (level-based), so running it twice, or after an
operator restart, converges to the same cluster without duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.manifest import parse_spec
from decentralized_verl.plan import plan_job
from decentralized_verl.spec import JobSpec
from dverl_operator import children as kids
from dverl_operator import status as st

ANNOTATION_FAILURE_COUNTED = "dverl.io/failure-counted"
ANNOTATION_FAILED_AT = "dverl.io/failed-at"
LEARNER = "learner"
# Changing these restarts the learner (new weights, new loss): refused while pods run.
RESTART_FIELDS = ("model", "algorithm")


@dataclass(frozen=True)
class Settings:
    default_image: str = "ghcr.io/dverl/worker:latest"
    backoff_base_seconds: float = 10.0
    backoff_max_seconds: float = 300.0
    resync_seconds: float = 10.0
    volunteer_gateway: bool = False
    """Expose each volunteer job's DHT bootstrap peer outside the cluster (chart: volunteers.gateway)."""
    volunteer_service_type: str = "LoadBalancer"


GATEWAY_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


@dataclass(frozen=True)
class Observed:
    job: Mapping[str, Any]
    """The RLHFJob as read from the API (metadata, spec, status)."""
    pods: Mapping[str, Mapping[str, Any]]
    config_map: Mapping[str, Any] | None
    service: Mapping[str, Any] | None
    progress: st.Progress | None
    now: float
    gateway: Mapping[str, Any] | None = None
    """The volunteer gateway Service, when one exists."""


@dataclass
class Actions:
    create: list[dict[str, Any]] = field(default_factory=list)
    patch: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(kind, name, merge patch) for ConfigMap / Service / Pod."""
    delete: list[tuple[str, str]] = field(default_factory=list)
    """(kind, name)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The complete desired `.status`."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type Normal|Warning, reason, message)."""
    requeue_after: float | None = None
    """Come back sooner than the resync interval (a backoff that ends, pods that terminate)."""

    def summary(self) -> str:
        return (
            f"create={[o['metadata']['name'] for o in self.create]} "
            f"delete={[name for _, name in self.delete]} patch={[name for _, name, _ in self.patch]}"
        )


def backoff_delay(restarts: int, settings: Settings) -> float:
    """Exponential backoff before the n-th restart of a role: base, 2*base, 4*base, ... capped."""
    if restarts <= 0:
        return 0.0
    return min(settings.backoff_base_seconds * 2 ** (restarts - 1), settings.backoff_max_seconds)


def applied_spec(config_map: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The spec the running pods were started with (rendered into the ConfigMap)."""
    if not config_map:
        return None
    text = (config_map.get("data") or {}).get(kids.CONFIG_KEY)
    if not text:
        return None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return loaded if isinstance(loaded, dict) else None


def refused_changes(old: Mapping[str, Any] | None, new: JobSpec) -> list[str]:
    """Fields that changed between the applied spec and the new one and need a learner restart."""
    if old is None:
        return []
    rendered = new.model_dump(mode="json", by_alias=True, exclude_none=True)
    return [f"spec.{name}" for name in RESTART_FIELDS if old.get(name) != rendered.get(name)]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _meta(obj).get("annotations") or {}


def _invalid(observed: Observed, problems: list[Problem], status: dict[str, Any]) -> Actions:
    """No children for a spec `dverl validate` would reject; say why, once, as a condition and Event."""
    message = "; ".join(str(p) for p in problems)
    previous = st.condition(status.get("conditions") or [], st.VALIDATION_FAILED)
    actions = Actions()
    if previous is None or previous.get("message") != message or previous.get("status") != "True":
        actions.events.append(("Warning", st.VALIDATION_FAILED, message))
    conditions = st.set_condition(
        status.get("conditions") or [], st.VALIDATION_FAILED, "True", "InvalidSpec", message, observed.now
    )
    conditions = st.drop_condition(conditions, st.READY)
    actions.status = {**status, "phase": "Failed", "message": message, "conditions": conditions}
    return actions


def _gateway(
    have: Mapping[str, Any] | None, want: Mapping[str, Any] | None, name: str, actions: Actions
) -> None:
    """Create, retype or remove the volunteer gateway Service so it matches the job and the chart."""
    if want is None:
        if have is not None:
            actions.delete.append(("Service", name))
        return
    if have is None:
        actions.create.append(dict(want))
        return
    have_spec, want_spec = have.get("spec") or {}, want["spec"]
    if have_spec.get("type") != want_spec["type"] or have_spec.get("ports") != want_spec["ports"]:
        actions.patch.append(
            ("Service", name, {"spec": {"type": want_spec["type"], "ports": want_spec["ports"]}})
        )


def gateway_address(gateway: Mapping[str, Any] | None) -> str | None:
    """Where volunteers dial the job's DHT peer: the load balancer's address, else the node port."""
    if gateway is None:
        return None
    spec = gateway.get("spec") or {}
    ports = spec.get("ports") or [{}]
    ingress = ((gateway.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    if spec.get("type") == "LoadBalancer" and ingress:
        host = ingress[0].get("ip") or ingress[0].get("hostname")
        return f"{host}:{ports[0].get('port')}"
    if spec.get("type") == "NodePort" and ports[0].get("nodePort"):
        return f"<any node>:{ports[0]['nodePort']}"
    if spec.get("type") == "ClusterIP" and spec.get("clusterIP") not in (None, "", "None"):
        return f"{spec['clusterIP']}:{ports[0].get('port')}"
    return None


def decide(observed: Observed, settings: Settings) -> Actions:
    """What the cluster must do for this job now. Pure; see the module docstring."""
    job = observed.job
    meta = _meta(job)
    name, namespace = meta["name"], meta.get("namespace") or "default"
    status: dict[str, Any] = dict(job.get("status") or {})
    now = observed.now
    if meta.get("generation") is not None:
        status["observedGeneration"] = int(meta["generation"])
    if meta.get("deletionTimestamp"):
        return Actions(status=status)  # the garbage collector removes the children

    # A terminal job stays terminal; its pods are gone (Failed) or finishing (Succeeded).
    if (
        status.get("phase") in st.TERMINAL_PHASES
        and st.condition(status.get("conditions") or [], st.VALIDATION_FAILED) is None
    ):
        actions = Actions(status=status)
        if status.get("phase") == "Failed":
            actions.delete = [("Pod", n) for n, p in observed.pods.items() if not st.pod_deleting(p)]
        return actions

    try:
        spec = parse_spec(job.get("spec"))
    except ManifestError as exc:
        return _invalid(observed, exc.problems, status)

    conditions = st.drop_condition(status.get("conditions") or [], st.VALIDATION_FAILED)
    actions = Actions()
    owner = kids.Owner(name=name, namespace=namespace, uid=str(meta.get("uid") or ""))

    # Refuse model/algorithm changes while pods run: the learner would restart from scratch silently.
    running_pods = [p for p in observed.pods.values() if not st.pod_deleting(p)]
    effective = spec
    old = applied_spec(observed.config_map)
    refused = refused_changes(old, spec) if running_pods and not spec.suspend else []
    if refused:
        try:
            effective = parse_spec(old)  # keep running what was applied; the change waits
        except ManifestError:
            effective = spec
        message = (
            f"{', '.join(refused)} changed while the job runs; this needs the learner restarted: "
            "set spec.suspend: true first, then change it and resume"
        )
        previous = st.condition(conditions, st.SPEC_CHANGE_REFUSED)
        if previous is None or previous.get("message") != message:
            actions.events.append(("Warning", st.SPEC_CHANGE_REFUSED, message))
        conditions = st.set_condition(
            conditions, st.SPEC_CHANGE_REFUSED, "True", "RestartRequired", message, now
        )
    else:
        conditions = st.drop_condition(conditions, st.SPEC_CHANGE_REFUSED)

    plan = plan_job(effective, name)
    image = effective.image or settings.default_image
    gateway_type = settings.volunteer_service_type if settings.volunteer_gateway else None
    desired = kids.for_job(owner, effective, plan, image, gateway_type=gateway_type)

    # ConfigMap and Service: create when missing, patch when their content drifted.
    if observed.config_map is None:
        actions.create.append(desired.config_map)
    elif _annotations(observed.config_map).get(kids.ANNOTATION_CONFIG_HASH) != _annotations(
        desired.config_map
    ).get(kids.ANNOTATION_CONFIG_HASH):
        actions.patch.append(
            (
                "ConfigMap",
                desired.config_map["metadata"]["name"],
                {
                    "metadata": {"annotations": desired.config_map["metadata"]["annotations"]},
                    "data": desired.config_map["data"],
                },
            )
        )
    if observed.service is None:
        actions.create.append(desired.service)
    elif (observed.service.get("spec") or {}).get("ports") != desired.service["spec"]["ports"]:
        actions.patch.append(
            (
                "Service",
                desired.service["metadata"]["name"],
                {"spec": {"ports": desired.service["spec"]["ports"]}},
            )
        )

    _gateway(observed.gateway, desired.gateway, kids.gateway_name(name), actions)

    restarts: dict[str, int] = {
        role: int((counts or {}).get("restarts", 0)) for role, counts in (status.get("roles") or {}).items()
    }
    plan_desired = plan.desired()

    if spec.suspend:
        actions.delete.extend(("Pod", n) for n, p in observed.pods.items() if not st.pod_deleting(p))
        conditions = st.set_condition(
            conditions, st.SUSPENDED, "True", "Suspended", "spec.suspend is true", now
        )
        conditions = st.set_condition(conditions, st.READY, "False", "Suspended", "pods removed", now)
        previous_phase = status.get("phase")
        if previous_phase != "Suspended":
            actions.events.append(("Normal", "Suspended", "pods removed; config and service kept"))
        roles = st.role_counts(plan_desired, [], restarts)
        status.pop("startTime", None)  # as a suspended Kubernetes Job: the clock restarts on resume
        actions.status = {
            **status,
            "phase": "Suspended",
            "message": "suspended",
            "conditions": conditions,
            "roles": roles,
            "workers": st.workers_column(roles),
        }
        return actions
    conditions = st.drop_condition(conditions, st.SUSPENDED)

    # ------------------------------------------------------------------- pods: scale, fail, restart
    for pod_name, pod in observed.pods.items():
        if pod_name not in desired.pods and not st.pod_deleting(pod):
            actions.delete.append(("Pod", pod_name))  # scaled down or role removed

    learner_names = [
        n for n in desired.pods if desired.pods[n]["metadata"]["labels"][kids.LABEL_ROLE] == LEARNER
    ]
    restart_messages: list[str] = []
    failed_job: str | None = None
    succeeded = False
    gang_restart = False
    to_delete: set[str] = set()
    to_create: list[str] = []

    for pod_name, want in desired.pods.items():
        role = want["metadata"]["labels"][kids.LABEL_ROLE]
        have = observed.pods.get(pod_name)
        if have is None:
            to_create.append(pod_name)
            continue
        if st.pod_deleting(have):
            continue
        phase = st.pod_phase(have)
        if phase == "Succeeded" and role == LEARNER and pod_name == learner_names[0]:
            succeeded = True
            continue
        if phase in ("Failed", "Succeeded"):
            annotations = _annotations(have)
            if annotations.get(ANNOTATION_FAILURE_COUNTED) != "true":
                restarts[role] = restarts.get(role, 0) + 1
                actions.patch.append(
                    (
                        "Pod",
                        pod_name,
                        {
                            "metadata": {
                                "annotations": {
                                    ANNOTATION_FAILURE_COUNTED: "true",
                                    ANNOTATION_FAILED_AT: f"{now:.3f}",
                                }
                            }
                        },
                    )
                )
                reason = (have.get("status") or {}).get("reason") or phase
                actions.events.append(
                    ("Warning", "WorkerFailed", f"pod {pod_name} ({role}) {phase.lower()}: {reason}")
                )
                failed_at = now
            else:
                failed_at = float(annotations.get(ANNOTATION_FAILED_AT) or now)
            if sum(restarts.values()) > spec.backoff_limit:
                per_role = ", ".join(f"{r}={n}" for r, n in sorted(restarts.items()) if n)
                failed_job = (
                    f"{sum(restarts.values())} worker restarts ({per_role}) "
                    f"exceed backoffLimit {spec.backoff_limit}"
                )
                continue
            wait = failed_at + backoff_delay(restarts.get(role, 0), settings) - now
            if wait > 0:
                restart_messages.append(f"{pod_name} restarts in {wait:.1f}s (backoff)")
                actions.requeue_after = min(actions.requeue_after or wait, wait)
                continue
            to_delete.add(pod_name)
            if role == LEARNER:
                gang_restart = True
            continue
        if _annotations(have).get(kids.ANNOTATION_TEMPLATE_HASH) != _annotations(want).get(
            kids.ANNOTATION_TEMPLATE_HASH
        ):
            to_delete.add(pod_name)  # placement, image or rendezvous changed: replace
            if role == LEARNER:
                gang_restart = True

    # Learner gang: torch.distributed needs every rank restarted together, from the last checkpoint.
    present_learners = [
        n for n in learner_names if n in observed.pods and not st.pod_deleting(observed.pods[n])
    ]
    learners_missing = [n for n in learner_names if n not in observed.pods]
    if present_learners and (learners_missing or gang_restart):
        failed_unfinished = [
            n
            for n in present_learners
            if st.pod_phase(observed.pods[n]) in ("Failed", "Succeeded") and n not in to_delete
        ]
        if not failed_unfinished:  # a failed learner still in backoff holds the gang until it ends
            to_delete.update(present_learners)
            if learners_missing or gang_restart:
                restart_messages.append("restarting the learner gang")
        to_create = [n for n in to_create if n not in learner_names]
    elif any(n in observed.pods for n in learner_names) and learners_missing:
        # Learners still terminating: create the gang only once all old ranks are gone.
        to_create = [n for n in to_create if n not in learner_names]

    if failed_job is not None:
        actions.delete.extend(("Pod", n) for n, p in observed.pods.items() if not st.pod_deleting(p))
        actions.events.append(("Warning", "BackoffLimitExceeded", failed_job))
        conditions = st.set_condition(conditions, st.FAILED, "True", "BackoffLimitExceeded", failed_job, now)
        conditions = st.set_condition(conditions, st.READY, "False", "BackoffLimitExceeded", failed_job, now)
        roles = st.role_counts(plan_desired, [], restarts)
        actions.status = {
            **status,
            "phase": "Failed",
            "message": failed_job,
            "conditions": conditions,
            "roles": roles,
            "workers": st.workers_column(roles),
            "completionTime": st.timestamp(now),
        }
        actions.patch = [p for p in actions.patch if p[0] != "Pod"]  # those pods are going away
        return actions

    actions.delete.extend(("Pod", n) for n in sorted(to_delete) if ("Pod", n) not in actions.delete)
    actions.create.extend(desired.pods[n] for n in to_create)
    if to_delete:
        actions.requeue_after = min(actions.requeue_after or 1.0, 1.0)

    # ------------------------------------------------------------------------------- status
    alive = [p for n, p in observed.pods.items() if n not in to_delete]
    roles = st.role_counts(plan_desired, alive, restarts)
    ready = sum(r["ready"] for r in roles.values())
    total = sum(r["desired"] for r in roles.values())
    new_status: dict[str, Any] = {**status, "roles": roles, "workers": st.workers_column(roles)}
    progress = observed.progress
    address = gateway_address(observed.gateway) if desired.gateway is not None else None
    if address:
        new_status["volunteerGateway"] = address
    else:
        new_status.pop("volunteerGateway", None)
    if progress is not None:
        new_status.update(progress.fields())
        already = int(status.get("blockedPeers") or 0)
        for peer_id, reason in st.newly_blocked(already, progress):
            actions.events.append(("Warning", "VolunteerBlocked", f"peer {peer_id} blocked: {reason}"))
        new_status["blockedPeers"] = max(already, len(progress.blocked_peers))
    if spec.training.steps and not new_status.get("totalSteps"):
        new_status["totalSteps"] = spec.training.steps
    if restart_messages:
        conditions = st.set_condition(
            conditions, st.RESTARTING, "True", "BackoffOrGang", "; ".join(restart_messages), now
        )
    else:
        conditions = st.drop_condition(conditions, st.RESTARTING)

    coordinator_state = progress.state if progress is not None else ""
    if succeeded or coordinator_state == "Succeeded":
        actions.create = [o for o in actions.create if o["kind"] != "Pod"]
        actions.delete = [
            ("Pod", n)
            for n, p in observed.pods.items()
            if n not in learner_names[:1] and not st.pod_deleting(p)
        ]
        conditions = st.set_condition(
            conditions, st.SUCCEEDED, "True", "TrainingComplete", "training finished", now
        )
        conditions = st.set_condition(conditions, st.READY, "False", "Completed", "training finished", now)
        new_status.update(
            phase="Succeeded",
            message="training finished",
            conditions=conditions,
            completionTime=st.timestamp(now),
        )
        actions.events.append(("Normal", "Succeeded", "training finished"))
        actions.status = new_status
        return actions
    if coordinator_state == "Failed":
        message = "the coordinator reports the training failed"
        conditions = st.set_condition(conditions, st.FAILED, "True", "CoordinatorFailed", message, now)
        new_status.update(
            phase="Failed", message=message, conditions=conditions, completionTime=st.timestamp(now)
        )
        actions.events.append(("Warning", "CoordinatorFailed", message))
        actions.status = new_status
        return actions

    if total and ready == total:
        conditions = st.set_condition(
            conditions, st.READY, "True", "AllWorkersReady", f"{ready}/{total} ready", now
        )
        new_status.setdefault("startTime", st.timestamp(now))
    else:
        conditions = st.set_condition(
            conditions, st.READY, "False", "WorkersNotReady", f"{ready}/{total} workers ready", now
        )
    phase = "Running" if new_status.get("startTime") else "Pending"
    new_status.update(
        phase=phase, message="" if not refused else "spec change refused", conditions=conditions
    )
    actions.status = new_status
    return actions
