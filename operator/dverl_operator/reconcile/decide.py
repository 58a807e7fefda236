"""Pure: (the RLHFJob, its observed children, coordinator progress, the clock) -> what to do.

The handler gathers what is observed, calls `decide`, and applies the returned `Actions`. All policy is
pure and reachable by tests; `decide` runs it in named phases, each its own function: settled
(`_settled`), validate (`_validated`: the spec, and that its workers fit their GPUs: planning) or
refuse (`_invalid`), refusal of restart-forcing changes (refusal.py), the wanted children
(`_wanted`, desired.py), shared children (`_sync_shared_children`: children/shared.py, the gang's PodGroup
from children/gang.py), suspend (`_suspend`), the Kueue group (`_record_group`, children/kueue.py), pods
(`_decide_pods`, pods/decisions.py: scale, backoff, preemption, learner gang; `_fail_job` when a role is
out of restarts), then status (`_finish`, status/outcome.py: Queued while a gang or an admission queue
holds the pods).
Every decision is a function of the observed state (level-based), so running it twice, or after an
operator restart, converges to the same cluster without duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decentralized_verl.core.memory_report import MemoryEstimate
from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.planning import plan_for
from decentralized_verl.planning.fit import planned_spec
from decentralized_verl.planning.fixes import gib, memory_quantity
from decentralized_verl.planning.plan import Plan, plan_job
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.spec.pod_security import (
    ENFORCE_LABEL,
    PodSecurityLevel,
    enforced_level,
    outside,
    permits,
    violations,
)
from decentralized_verl.spec.source_paths import unseen_paths
from dverl_operator.children import gang, kueue
from dverl_operator.children.job_children import Children
from dverl_operator.children.services import gateway_address
from dverl_operator.children.shared import sync_shared
from dverl_operator.objects import owned, quantity
from dverl_operator.objects.pod_state import pod_deleting
from dverl_operator.pods import marks as pod_marks
from dverl_operator.pods.decisions import (
    PodDecision,
    decide_pods,
    learner_names,
    restart_stalled,
    stalled_learner,
)
from dverl_operator.reconcile.actions import Actions
from dverl_operator.reconcile.desired import for_job
from dverl_operator.reconcile.observed import Observed
from dverl_operator.reconcile.refusal import refuse_restart_changes
from dverl_operator.reconcile.settings import Settings
from dverl_operator.status import conditions as cond
from dverl_operator.status import outcome
from dverl_operator.status.fields import role_counts
from dverl_operator.status.image_pulls import cannot_pull
from dverl_operator.status.scheduling import unschedulable

OOM_HEADROOM = 1.25
"""The estimate a killed worker's advice asks for, with room for what the estimate leaves out."""
OOM_RAISE = 1.5
"""At least this much more than the limit a worker was killed under."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _invalid(observed: Observed, problems: list[Problem], status: dict[str, Any]) -> Actions:
    """No children for a spec `dverl validate` would reject; say why, once, as a condition and Event."""
    message = "; ".join(str(p) for p in problems)
    previous = cond.condition(status.get("conditions") or [], cond.VALIDATION_FAILED)
    actions = Actions()
    if previous is None or previous.get("message") != message or previous.get("status") != "True":
        actions.events.append(("Warning", cond.VALIDATION_FAILED, message))
    conditions = cond.set_condition(
        status.get("conditions") or [], cond.VALIDATION_FAILED, "True", "InvalidSpec", message, observed.now
    )
    conditions = cond.drop_condition(conditions, cond.READY)
    actions.status = {**status, "phase": "Failed", "message": message, "conditions": conditions}
    return actions


def _settled(observed: Observed, status: dict[str, Any]) -> Actions | None:
    """A job being deleted or already terminal needs nothing but its pods gone (Failed) or kept, its
    gang gone and its Kueue group finished (quota released)."""
    if _meta(observed.job).get("deletionTimestamp"):
        return Actions(status=status)  # the garbage collector removes the children
    if (
        status.get("phase") in cond.TERMINAL_PHASES
        and cond.condition(status.get("conditions") or [], cond.VALIDATION_FAILED) is None
    ):
        actions = Actions(status=_group_finished(status))
        actions.patch = kueue.finish(observed.pods, keep=None)
        actions.delete = gang.sync(observed.pod_groups, None)[2]
        if status.get("phase") == "Failed":
            actions.delete += [("Pod", n) for n, p in observed.pods.items() if not pod_deleting(p)]
        return actions
    return None


def _group_finished(status: dict[str, Any]) -> dict[str, Any]:
    """The recorded Kueue pod group marked finished: the next run of the job gets a new one."""
    group = kueue.PodGroup.from_status(status)
    if group is None or group.finished:
        return status
    return {**status, kueue.STATUS_KEY: {**group.to_status(), "finished": True}}


def _gang_refused(spec: Any, settings: Settings) -> list[Problem]:
    chosen = spec.scheduling.gang
    if chosen is None or chosen.scheduler in settings.gang_schedulers:
        return []
    return [
        Problem(
            "spec.scheduling.gang.scheduler",
            f"{chosen.scheduler} PodGroups are not enabled in this operator: install the chart with "
            f"gangScheduling.{chosen.scheduler}=true (it grants the RBAC they need)",
        )
    ]


def _accounts_refused(spec: JobSpec, settings: Settings) -> list[Problem]:
    """A podTemplate's serviceAccountName only from the operator's list: the operator creates pods
    under any account of the namespace, so the list, not the job's author, decides which it lends."""
    problems = []
    allowed = ", ".join(sorted(settings.service_accounts)) or "none"
    for name, role in spec.roles.items():
        account = role.pod_template.spec.service_account_name if role.pod_template is not None else None
        if account and account not in settings.service_accounts:
            problems.append(
                Problem(
                    f"spec.roles.{name}.podTemplate.spec.serviceAccountName",
                    f"{account!r} is not one this operator may give pods (allowed: {allowed}; the chart's "
                    "podTemplate.serviceAccountNames)",
                )
            )
    return problems


def _profile_refused(pods: Mapping[str, Mapping[str, Any]], level: PodSecurityLevel) -> list[Problem]:
    """Every pod the job would get, checked against the job's Pod Security level (spec.podSecurity) before
    any is created: what `dverl validate` checked of the template, now on the merged pods, so nothing
    outside the declared profile is ever sent to the API server."""
    return [
        Problem(f"pod {name}: {v.field}", f"{v.message} ({outside(level, v.rule)})")
        for name, pod in sorted(pods.items())
        for v in violations(pod, level)
    ]


def _namespace_refused(spec: JobSpec, observed: Observed) -> list[Problem]:
    """A job that declares more than its namespace's Pod Security enforce label admits is refused before
    anything is created: admission would refuse each of its pods, one create at a time."""
    enforced = enforced_level(observed.namespace_labels)
    if permits(enforced, spec.pod_security):
        return []
    namespace = _meta(observed.job).get("namespace") or "default"
    label = observed.namespace_labels.get(ENFORCE_LABEL)
    return [
        Problem(
            "spec.podSecurity",
            f"{spec.pod_security!r} is more than namespace {namespace!r} admits: its label "
            f"{ENFORCE_LABEL}={label} enforces {enforced}",
        )
    ]


def _all_pods_go(observed: Observed) -> list[tuple[str, str]]:
    return [("Pod", n) for n, p in observed.pods.items() if not pod_deleting(p)]


def decide(observed: Observed, settings: Settings) -> Actions:
    """What the cluster must do for this job now. Pure; see the module docstring."""
    meta = _meta(observed.job)
    status: dict[str, Any] = dict(observed.job.get("status") or {})
    if meta.get("generation") is not None:
        status["observedGeneration"] = int(meta["generation"])
    settled = _settled(observed, status)
    if settled is not None:
        return settled
    spec = _validated(observed, settings, status)
    if isinstance(spec, Actions):
        return spec

    # Validated; refuse changes that would restart a running learner.
    actions = Actions()
    running_pods = any(not pod_deleting(p) for p in observed.pods.values())
    conditions = cond.drop_condition(status.get("conditions") or [], cond.VALIDATION_FAILED)
    refusal = refuse_restart_changes(spec, observed.config_map, running_pods, conditions, observed.now)
    actions.events.extend(refusal.events)
    conditions = refusal.conditions

    wanted = _wanted(observed, settings, status, refusal.effective)
    beyond = _profile_refused(wanted.desired.pods, spec.pod_security)
    if beyond:
        return _invalid(observed, beyond, status)
    _sync_shared_children(observed, actions, wanted, suspended=spec.suspend)
    restarts = {role: int((c or {}).get("restarts", 0)) for role, c in (status.get("roles") or {}).items()}
    plan_desired = wanted.plan.desired()

    if spec.suspend:
        return _suspend(observed, actions, status, conditions, plan_desired, restarts)
    conditions = cond.drop_condition(conditions, cond.SUSPENDED)
    _record_group(observed, actions, status, wanted.group)

    pods = _decide_pods(observed, settings, status, spec, wanted.desired.pods, restarts)
    actions.delete.extend(("Pod", n) for n in pods.scaled_away)
    actions.patch.extend(pods.patches)
    actions.events.extend(pods.events)
    actions.requeue_after = pods.requeue_after
    if pods.failed_job is not None:
        return _fail_job(observed, actions, status, conditions, plan_desired, pods)
    _apply_pods(actions, pods, wanted.desired.pods)
    alive = {n: p for n, p in observed.pods.items() if n not in pods.to_delete}
    queued = kueue.held(alive) or gang.held(alive, wanted.spec, wanted.plan)
    return _finish(
        observed,
        actions,
        status,
        conditions,
        pods,
        plan_desired,
        spec,
        wanted.desired,
        refusal.refused,
        queued,
    )


def _validated(observed: Observed, settings: Settings, status: dict[str, Any]) -> JobSpec | Actions:
    """The spec as the children are made from it, or the refusal of a job that cannot run: one that
    `dverl validate` would reject, whose workers cannot fit their GPUs, or that asks for a gang scheduler
    this operator may not manage. Planning belongs to validation here because an over-large model is a
    spec error the user fixes, not a runtime failure."""
    try:
        spec = parse_spec(observed.job.get("spec"))
    except ManifestError as exc:
        return _invalid(observed, exc.problems, status)
    # The operator reads no user folders: model shapes come from model.tiny and the known-shapes table,
    # else are not checked. A rollout whose model fits on no single worker runs as the layer spans the
    # planner chose: the spec every child is made from (the ConfigMap the workers read included) carries
    # them.
    memory = plan_for(spec, base_dir=None)
    spec = planned_spec(spec, memory)
    unseen = [Problem(field, why) for field, why in unseen_paths(spec)]
    too_big = (
        memory.problems()
        + _gang_refused(spec, settings)
        + _accounts_refused(spec, settings)
        + _namespace_refused(spec, observed)
        + unseen
    )
    if too_big:
        return _invalid(observed, too_big, status)
    return spec


@dataclass(frozen=True)
class _Wanted:
    """What the effective spec asks of the cluster, computed once and read by every later phase."""

    spec: JobSpec
    """The effective spec: the one after refused changes were put back."""
    plan: Plan
    owner: owned.Owner
    desired: Children
    group: kueue.PodGroup | None
    """The Kueue pod group the pods belong to (None: the job is not queued)."""


def _wanted(observed: Observed, settings: Settings, status: dict[str, Any], effective: JobSpec) -> _Wanted:
    """The children the effective spec (the one after refusals) wants, marked for the schedulers that
    will read them. Kept apart from syncing so the pods phase reads the same desired pods."""
    meta = _meta(observed.job)
    name = meta["name"]
    plan = plan_job(effective, name)
    owner = owned.Owner(
        name=name, namespace=meta.get("namespace") or "default", uid=str(meta.get("uid") or "")
    )
    gateway_type = settings.volunteer_service_type if settings.volunteer_gateway else None
    image = effective.image or settings.default_image
    queue = kueue.queue_name(observed.job)
    group = kueue.current_group(status, name, owner.uid, len(plan.workers)) if queue else None
    marks = pod_marks.for_job(effective, observed.job, plan, group)
    desired = for_job(
        owner,
        effective,
        plan,
        image,
        gateway_type=gateway_type,
        policy=settings.network_policy,
        marks=marks,
    )
    return _Wanted(spec=effective, plan=plan, owner=owner, desired=desired, group=group)


def _sync_shared_children(observed: Observed, actions: Actions, wanted: _Wanted, *, suspended: bool) -> None:
    """The children every pod relies on (ConfigMap, Services, NetworkPolicies, credentials, the gang's
    PodGroup) are synced before any pod decision, and even while suspended, so a resumed job's pods
    find them in place. A suspended job holds no gang: its PodGroup goes with its pods."""
    name = _meta(observed.job)["name"]
    create, patch, delete = sync_shared(
        observed.config_map, observed.service, observed.gateway, wanted.desired, name, observed.policies
    )
    effective_gang = None if suspended else gang.pod_group(wanted.owner, wanted.spec, wanted.plan)
    gang_create, gang_patch, gang_delete = gang.sync(observed.pod_groups, effective_gang)
    actions.issue_credentials = not observed.credentials_ready
    actions.create.extend(create + gang_create)
    actions.patch.extend(patch + gang_patch)
    actions.delete.extend(delete + gang_delete)


def _suspend(
    observed: Observed,
    actions: Actions,
    status: dict[str, Any],
    conditions: list,
    plan_desired: Mapping[str, int],
    restarts: dict[str, int],
) -> Actions:
    """Suspended, as Kueue expects of a queued job: pods gone and their group finished (quota freed);
    resuming queues a new group. Restart counts are kept so a resumed job's backoff goes on."""
    actions.patch.extend(kueue.finish(observed.pods, keep=None))
    actions.delete.extend(_all_pods_go(observed))
    actions.status, events = outcome.suspended(
        _group_finished(status), conditions, plan_desired, restarts, observed.now
    )
    actions.events.extend(events)
    return actions


def _record_group(
    observed: Observed, actions: Actions, status: dict[str, Any], group: kueue.PodGroup | None
) -> None:
    """The job's Kueue pod group is recorded in its status (so the next pass keeps the same one), and
    any pod of another group ends that group: one of another size, or one the dropped queue label left."""
    if group is not None:
        status[kueue.STATUS_KEY] = group.to_status()
        actions.patch.extend(kueue.finish(observed.pods, keep=group.name))
    else:
        status.pop(kueue.STATUS_KEY, None)
        actions.patch.extend(kueue.finish(observed.pods, keep=None))


def _decide_pods(
    observed: Observed,
    settings: Settings,
    status: dict[str, Any],
    spec: JobSpec,
    desired_pods: Mapping[str, dict[str, Any]],
    restarts: dict[str, int],
) -> PodDecision:
    """Pods: scale, failures and backoff (pods/decisions.py), then a learner that stopped making
    progress restarts the learner gang as if it had failed."""
    pods = decide_pods(
        observed.pods,
        desired_pods,
        spec,
        restarts,
        observed.now,
        (settings.backoff_base_seconds, settings.backoff_max_seconds),
        oom_advice=lambda role, limit, reported: oom_advice(spec, role, limit, reported),
    )
    learners = learner_names(desired_pods)
    stalled = stalled_learner(
        status, observed.pods, learners, spec.training.stall_factor, observed.now, others=desired_pods
    )
    if stalled is not None:
        restart_stalled(pods, observed.pods, learners, stalled)
    return pods


def oom_advice(spec: JobSpec, role: str, limit: str | None, reported: MemoryEstimate | None = None) -> str:
    """The planner's fix for a role whose worker the kernel killed for memory: its estimate of what one
    worker needs, as the memory setting to give it, and never less than half again the limit it died
    under (the estimate missed something there). The worker's own estimate (`reported`: planned with
    its model's files, which the operator never reads) comes first; else the operator's, which knows a
    model's shape only from `model.tiny` or the known-shapes table."""
    died_under = int(quantity.parse(limit)) if limit else 0
    if reported is not None:
        return _sized_advice(role, reported.host_bytes, died_under)
    memory = plan_for(spec, base_dir=None)
    for worker in memory.workers:
        if worker.role == role and worker.verdict != "not checked":
            return _sized_advice(role, worker.estimate.host, died_under)
    raise_to = f" to >= {memory_quantity(int(died_under * OOM_RAISE))}" if died_under else ""
    return (
        f"the planner has no estimate for {role} (its model's shape is unknown to it): raise "
        f"roles.{role}.resources.memory{raise_to} or lower roles.{role}.microbatchSize"
    )


def _sized_advice(role: str, host: int, died_under: int) -> str:
    need = max(int(host * OOM_HEADROOM), int(died_under * OOM_RAISE))
    return (
        f"the planner estimates ~{gib(host)} GiB of host memory per {role} worker; "
        f"set roles.{role}.resources.memory >= {memory_quantity(need)} or lower "
        f"roles.{role}.microbatchSize"
    )


def _fail_job(
    observed: Observed,
    actions: Actions,
    status: dict[str, Any],
    conditions: list,
    plan_desired: Mapping[str, int],
    pods: PodDecision,
) -> Actions:
    """A role out of restarts fails the whole job: every pod goes (so no pod is patched on its way
    out) and the Kueue group ends, freeing the quota."""
    actions.delete.extend(_all_pods_go(observed))
    actions.patch = [p for p in actions.patch if p[0] != "Pod"]
    actions.patch.extend(kueue.finish(observed.pods, keep=None))
    actions.status, events = outcome.backoff_exhausted(
        _group_finished(status),
        conditions,
        plan_desired,
        pods.restarts,
        pods.failed_job,
        observed.now,
        pods.failed_reason,
    )
    actions.events.extend(events)
    return actions


def _apply_pods(actions: Actions, pods: PodDecision, desired_pods: Mapping[str, dict[str, Any]]) -> None:
    actions.delete.extend(("Pod", n) for n in sorted(pods.to_delete) if ("Pod", n) not in actions.delete)
    actions.create.extend(desired_pods[n] for n in pods.to_create)
    if pods.to_delete:
        actions.requeue_after = min(actions.requeue_after or 1.0, 1.0)


def _finish(
    observed: Observed,
    actions: Actions,
    status: dict[str, Any],
    conditions: list,
    pods: PodDecision,
    plan_desired: Mapping[str, int],
    spec: Any,
    desired: Children,
    refused: list[str],
    queued: tuple[str, str] | None = None,
) -> Actions:
    """Status: roles, progress, restarts; then the phase (succeeded, failed, running or pending)."""
    now = observed.now
    alive = [p for n, p in observed.pods.items() if n not in pods.to_delete]
    roles = role_counts(plan_desired, alive, pods.restarts)
    gateway = gateway_address(observed.gateway) if desired.gateway is not None else None
    new_status, events = outcome.progress_status(
        status, outcome.with_roles(status, roles), observed.progress, gateway, spec.training.steps, now
    )
    actions.events.extend(events)
    if pods.restart_messages:
        counts = ", ".join(f"{r}={n}" for r, n in sorted(pods.restarts.items()) if n)
        message = "; ".join(pods.restart_messages) + (f" (restarts so far: {counts})" if counts else "")
        conditions = cond.set_condition(
            conditions, cond.RESTARTING, "True", pods.restart_reason, message, now
        )
    else:
        conditions = cond.drop_condition(conditions, cond.RESTARTING)
    coordinator_state = observed.progress.state if observed.progress is not None else ""
    if pods.succeeded or coordinator_state == "Succeeded":
        first_learner = learner_names(desired.pods)[:1]
        learner = observed.pods.get(first_learner[0]) if first_learner else None
        new_status = outcome.with_final_report(new_status, learner)
        actions.create = [o for o in actions.create if o["kind"] != "Pod"]
        actions.delete = [
            ("Pod", n) for n, p in observed.pods.items() if n not in first_learner and not pod_deleting(p)
        ]
        ending = kueue.finish(observed.pods, keep=None)  # every group ends: no pod patched twice
        actions.patch = [p for p in actions.patch if p not in ending] + ending
        actions.status, events = outcome.succeeded(_group_finished(new_status), conditions, now)
    elif coordinator_state == "Failed":
        actions.status, events = outcome.coordinator_failed(new_status, conditions, now, observed.progress)
    else:
        staying = {n: p for n, p in observed.pods.items() if n not in pods.to_delete}
        actions.status, events = outcome.running(
            new_status, conditions, bool(refused), now, queued, unschedulable(staying), cannot_pull(staying)
        )
    actions.events.extend(events)
    return actions
