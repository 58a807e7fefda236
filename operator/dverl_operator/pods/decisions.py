"""Which pods of a job to create and delete now: scale, failures counted once with exponential backoff,
failures no retry can mend (bad input, out of memory) ending the job at once, preempted or evicted pods
replaced at once and not counted, replaced templates, and the gangs: the learners and a sharded critic's
ranks (torch.distributed needs every rank restarted together). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.core.memory_report import MemoryEstimate
from decentralized_verl.errors import BAD_INPUT_REASON, REFIT_PARITY_REASON
from decentralized_verl.launch.watchdog import STARTUP_S, allowance
from decentralized_verl.planning.plan import is_gang
from decentralized_verl.spec import JobSpec
from dverl_operator.objects import owned
from dverl_operator.objects.pod_state import pod_deleting, pod_phase, pod_ready
from dverl_operator.objects.times import parse_time
from dverl_operator.pods.disruption import disruption, event_reason
from dverl_operator.pods.failure import ending, failure_reason, memory_limit

ANNOTATION_FAILURE_COUNTED = "dverl.io/failure-counted"
ANNOTATION_FAILED_AT = "dverl.io/failed-at"
DISRUPTED = "disrupted"
"""ANNOTATION_FAILURE_COUNTED's value on a pod the cluster took away: announced, never counted."""
LEARNER = "learner"
OomAdvice = Callable[[str, str | None, MemoryEstimate | None], str]
"""(role, the memory limit it died under, the worker's own estimate or None) -> the fix to name."""


@dataclass
class PodDecision:
    to_create: list[str] = field(default_factory=list)
    to_delete: set[str] = field(default_factory=set)
    scaled_away: list[str] = field(default_factory=list)
    """Pods no longer in the plan (scaled down or role removed)."""
    patches: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    restart_messages: list[str] = field(default_factory=list)
    restart_reason: str = "WorkerFailed"
    failed_job: str | None = None
    """Why the job fails (restarts past backoffLimit, bad input, out of memory), or None."""
    failed_reason: str = "BackoffLimitExceeded"
    """The reason of the job's Failed condition and Event when `failed_job` is set."""
    succeeded: bool = False
    """Learner 0 exited successfully."""
    requeue_after: float | None = None


def backoff_delay(restarts: int, base_seconds: float, max_seconds: float) -> float:
    """Exponential backoff before the n-th restart of a role: base, 2*base, 4*base, ... capped."""
    if restarts <= 0:
        return 0.0
    return min(base_seconds * 2 ** (restarts - 1), max_seconds)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def learner_names(desired_pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [n for n, p in desired_pods.items() if p["metadata"]["labels"][owned.LABEL_ROLE] == LEARNER]


def decide_pods(
    pods: Mapping[str, Mapping[str, Any]],
    desired_pods: Mapping[str, Mapping[str, Any]],
    spec: JobSpec,
    restarts: Mapping[str, int],
    now: float,
    backoff: tuple[float, float],
    oom_advice: OomAdvice | None = None,
) -> PodDecision:
    """`backoff` is (base, max) seconds; `oom_advice(role, limit, reported)` is the planner's fix for a
    role whose worker ran out of memory under `limit`, `reported` the worker's own estimate when its
    termination message held one (pure, asked only when one did)."""
    out = PodDecision(restarts=dict(restarts))
    by_role: dict[str, list[str]] = {}
    for name, pod in desired_pods.items():
        by_role.setdefault(pod["metadata"]["labels"][owned.LABEL_ROLE], []).append(name)
    out.scaled_away = [n for n, p in pods.items() if n not in desired_pods and not pod_deleting(p)]
    learners = learner_names(desired_pods)
    gangs = {r for r in by_role if (spec_role := getattr(spec.roles, r, None)) and is_gang(r, spec_role)}
    gang_restart: set[str] = set()
    for pod_name, want in desired_pods.items():
        role = want["metadata"]["labels"][owned.LABEL_ROLE]
        have = pods.get(pod_name)
        if have is None:
            out.to_create.append(pod_name)
            continue
        if pod_deleting(have):
            _announce_disruption(out, pod_name, role, have)
            continue
        phase = pod_phase(have)
        if phase == "Succeeded" and role == LEARNER and pod_name == learners[0]:
            out.succeeded = True
            continue
        if phase == "Failed" and disruption(have) is not None:
            _disrupted(out, pod_name, role, have)
            if role in gangs:
                gang_restart.add(role)
            elif spec.roles.failure_policy(role) == "restartRole":
                out.to_delete.update(n for n in by_role[role] if n in pods and not pod_deleting(pods[n]))
            continue
        if phase in ("Failed", "Succeeded"):
            if phase == "Failed" and _unmendable(out, pod_name, role, have, oom_advice):
                continue
            replace = _exited(out, pod_name, role, have, phase, spec, now, backoff)
            policy = spec.roles.failure_policy(role)
            if replace and policy == "failJob" and not _ends_unmended(out):
                out.failed_job = (
                    f"pod {pod_name} ({role}) {phase.lower()} and roles.{role}.failurePolicy is failJob"
                )
            elif replace and policy == "restartRole" and role not in gangs:
                out.to_delete.update(n for n in by_role[role] if n in pods and not pod_deleting(pods[n]))
                out.restart_messages.append(f"restarting every {role} worker (failurePolicy restartRole)")
            if replace and role in gangs:
                gang_restart.add(role)
            continue
        if _annotations(have).get(owned.ANNOTATION_TEMPLATE_HASH) != _annotations(want).get(
            owned.ANNOTATION_TEMPLATE_HASH
        ):
            out.to_delete.add(pod_name)  # placement, image or rendezvous changed: replace
            if role in gangs:
                gang_restart.add(role)
    for role in sorted(gangs):
        _gang(out, pods, by_role[role], role in gang_restart, role)
    return out


def _ends_unmended(out: PodDecision) -> bool:
    """The job already ends for a failure no retry mends: that cause is the one it names."""
    return out.failed_job is not None and out.failed_reason != "BackoffLimitExceeded"


def _unmendable(
    out: PodDecision,
    pod_name: str,
    role: str,
    have: Mapping[str, Any],
    oom_advice: OomAdvice | None,
) -> bool:
    """A failure that would fail the same way again ends the job now, with what the worker said: the
    runtime's bad-input exit (a manifest, data file or model to fix), a learner's refit-parity exit (the
    verdict names the rollout workers, the learner and the version), or a kill for memory (the same
    limit kills it again), named with the role, its limit and the planner's fix."""
    end = ending(have)
    if end.kind == "bad-input":
        said = f": {end.message}" if end.message else ""
        out.failed_job = (
            f"pod {pod_name} ({role}): container {end.container} exited {end.exit_code} (bad input, not "
            f"retried){said}"
        )
        out.failed_reason = BAD_INPUT_REASON
    elif end.kind == "oom":
        limit = memory_limit(have, end.container)
        under = f"its memory limit {limit}" if limit else "no memory limit (the node ran out)"
        reported = end.estimate if end.estimate is not None and end.estimate.role == role else None
        advice = oom_advice(role, limit, reported) if oom_advice is not None else ""
        out.failed_job = (
            f"pod {pod_name} ({role}): container {end.container} was OOMKilled under {under}; "
            f"{advice or f'raise roles.{role}.resources.memory'}"
        )
        out.failed_reason = "OOMKilled"
    elif end.kind == "refit-parity" and role == "learner":  # only the learner ends with that code
        said = end.message or "its log names the rollout workers and the version"
        out.failed_job = (
            f"pod {pod_name} ({role}): container {end.container} exited {end.exit_code} (refit parity "
            f"failed, not retried): {said}"
        )
        out.failed_reason = REFIT_PARITY_REASON
    else:
        return False
    if _annotations(have).get(ANNOTATION_FAILURE_COUNTED) != "true":
        out.restarts[role] = out.restarts.get(role, 0) + 1
        said = failure_reason(have)
        out.events.append(("Warning", "WorkerFailed", f"pod {pod_name} ({role}) failed: {said}"))
    return True


def _exited(
    out: PodDecision,
    pod_name: str,
    role: str,
    have: Mapping[str, Any],
    phase: str,
    spec: JobSpec,
    now: float,
    backoff: tuple[float, float],
) -> bool:
    """Count an exited pod's failure once, then replace it after its backoff; True when it is replaced."""
    annotations = _annotations(have)
    if annotations.get(ANNOTATION_FAILURE_COUNTED) != "true":
        out.restarts[role] = out.restarts.get(role, 0) + 1
        marks = {ANNOTATION_FAILURE_COUNTED: "true", ANNOTATION_FAILED_AT: f"{now:.3f}"}
        out.patches.append(("Pod", pod_name, {"metadata": {"annotations": marks}}))
        reason = failure_reason(have)
        out.events.append(("Warning", "WorkerFailed", f"pod {pod_name} ({role}) {phase.lower()}: {reason}"))
        failed_at = now
    else:
        failed_at = float(annotations.get(ANNOTATION_FAILED_AT) or now)
    total = sum(out.restarts.values())
    if total > spec.backoff_limit and not _ends_unmended(out):
        per_role = ", ".join(f"{r}={n}" for r, n in sorted(out.restarts.items()) if n)
        out.failed_job = (
            f"{total} worker restarts ({per_role}) exceed backoffLimit {spec.backoff_limit}; "
            f"last: pod {pod_name} ({role}) {phase.lower()}: {failure_reason(have)}"
        )
        return False
    wait = failed_at + backoff_delay(out.restarts.get(role, 0), *backoff) - now
    if wait > 0:
        out.restart_messages.append(f"{pod_name} restarts in {wait:.1f}s (backoff)")
        out.requeue_after = min(out.requeue_after or wait, wait)
        return False
    out.to_delete.add(pod_name)
    out.events.append(
        ("Normal", "Restarting", f"pod {pod_name} ({role}): restart {out.restarts.get(role, 0)}")
    )
    return True


def _announce_disruption(out: PodDecision, pod_name: str, role: str, have: Mapping[str, Any]) -> None:
    """One Event for a pod the cluster is taking away (marked so a later pass stays quiet)."""
    why = disruption(have)
    if why is None:
        return
    if _annotations(have).get(ANNOTATION_FAILURE_COUNTED) != DISRUPTED:
        marks = {ANNOTATION_FAILURE_COUNTED: DISRUPTED}
        out.patches.append(("Pod", pod_name, {"metadata": {"annotations": marks}}))
        out.events.append(
            (
                "Warning",
                event_reason(why),
                f"pod {pod_name} ({role}) taken away by the cluster ({why}); replaced without counting "
                "against backoffLimit",
            )
        )


def _disrupted(out: PodDecision, pod_name: str, role: str, have: Mapping[str, Any]) -> None:
    """A preempted or evicted pod: replaced now, no backoff, no restart counted, whatever failurePolicy
    says (the worker did not fail; the cluster needed its place)."""
    _announce_disruption(out, pod_name, role, have)
    out.to_delete.add(pod_name)
    why = disruption(have) or ""
    out.restart_messages.append(f"{pod_name} was {event_reason(why).lower()}; replacing it")
    out.restart_reason = event_reason(why)


def _ready_since(pod: Mapping[str, Any] | None) -> float | None:
    """When a pod became ready, or None while it is not (not made yet, being deleted, pending, starting)."""
    if pod is None or pod_deleting(pod) or not pod_ready(pod):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            at = parse_time(condition.get("lastTransitionTime"))
            if at is not None:
                return at
    return parse_time((pod.get("status") or {}).get("startTime")) or 0.0


def stalled_learner(
    status: Mapping[str, Any],
    pods: Mapping[str, Mapping[str, Any]],
    learners: list[str],
    stall_factor: float,
    now: float,
    others: Iterable[str] = (),
) -> str | None:
    """Why the learner counts as stalled (its step has not advanced within its allowance while its pod
    runs), or None. The clock starts again with each learner pod, so a new one has time to load, and
    with each pod the learner works with (`others`: the job's other desired pods) becoming ready: a
    learner waiting on a pod being replaced or still starting is waiting, not stalled, however long a
    loaded node takes to start it, and once that pod is ready the step it was waiting for gets its full
    allowance."""
    first = pods.get(learners[0]) if learners else None
    if first is None or pod_deleting(first) or pod_phase(first) != "Running":
        return None
    started = parse_time(
        ((first.get("status") or {}).get("startTime")) or first["metadata"].get("creationTimestamp")
    )
    progressed = parse_time(status.get("lastProgressTime"))
    if started is None:
        return None
    readied = [_ready_since(pods.get(name)) for name in others if name not in learners]
    if any(at is None for at in readied):
        return None
    since = max(started, progressed or started, *(at for at in readied if at is not None))
    step_seconds = status.get("stepSeconds")
    fresh = progressed is None or progressed < started or not step_seconds
    limit = STARTUP_S if fresh else allowance([float(step_seconds)], stall_factor)
    if now - since <= limit:
        return None
    return f"the learner's step has not advanced for {now - since:.0f}s (allowed {limit:.0f}s)"


def restart_stalled(
    out: PodDecision, pods: Mapping[str, Mapping[str, Any]], learners: list[str], why: str
) -> None:
    """Take the whole learner gang down (it comes back from its newest checkpoint), counted as a restart."""
    out.to_delete.update(n for n in learners if n in pods and not pod_deleting(pods[n]))
    out.restarts[LEARNER] = out.restarts.get(LEARNER, 0) + 1
    out.events.append(("Warning", "LearnerStalled", f"{why}; restarting the learner gang"))
    out.restart_messages.append(f"learner stalled: {why}")
    out.restart_reason = "LearnerStalled"


def _gang(
    out: PodDecision,
    pods: Mapping[str, Mapping[str, Any]],
    ranks: list[str],
    gang_restart: bool,
    role: str = LEARNER,
) -> None:
    """torch.distributed needs every rank restarted together, from the last checkpoint: the learners, and
    the ranks of a sharded critic."""
    present = [n for n in ranks if n in pods and not pod_deleting(pods[n])]
    missing = [n for n in ranks if n not in pods]
    if present and (missing or gang_restart):
        failed_unfinished = [
            n for n in present if pod_phase(pods[n]) in ("Failed", "Succeeded") and n not in out.to_delete
        ]
        if not failed_unfinished:  # a failed rank still in backoff holds the gang until it ends
            out.to_delete.update(present)
            out.restart_messages.append(f"restarting the {role} gang")
        out.to_create = [n for n in out.to_create if n not in ranks]
    elif any(n in pods for n in ranks) and missing:
        # Ranks still terminating: create the gang only once all old ranks are gone.
        out.to_create = [n for n in out.to_create if n not in ranks]
