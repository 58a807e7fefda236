"""The job's `.status` after a reconcile pass: suspended, failed past backoffLimit, succeeded, failed as the
coordinator reports, or running/pending with its progress. Pure; each returns the complete new status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decentralized_verl.core.final_report import read_final
from decentralized_verl.core.status import JobStatus
from dverl_operator.objects.times import timestamp
from dverl_operator.status.conditions import (
    FAILED,
    IMAGE_PULL_FAILED,
    QUEUED,
    READY,
    SUCCEEDED,
    SUSPENDED,
    UNSCHEDULABLE,
    condition,
    drop_condition,
    set_condition,
)
from dverl_operator.status.fields import newly_blocked, progress_fields, role_counts, workers_column

Status = dict[str, Any]
Events = list[tuple[str, str, str]]


def with_roles(status: Mapping[str, Any], roles: dict[str, dict[str, int]], **fields: Any) -> Status:
    return {**status, "roles": roles, "workers": workers_column(roles), **fields}


def suspended(
    status: Mapping[str, Any],
    conditions: list,
    desired: Mapping[str, int],
    restarts: Mapping[str, int],
    now: float,
) -> tuple[Status, Events]:
    """Pods removed, config and service kept; as a suspended Kubernetes Job the clock restarts on resume."""
    conditions = set_condition(conditions, SUSPENDED, "True", "Suspended", "spec.suspend is true", now)
    conditions = set_condition(conditions, READY, "False", "Suspended", "pods removed", now)
    events = (
        []
        if status.get("phase") == "Suspended"
        else [("Normal", "Suspended", "pods removed; config and service kept")]
    )
    kept = {k: v for k, v in status.items() if k != "startTime"}
    roles = role_counts(desired, [], restarts)
    return with_roles(kept, roles, phase="Suspended", message="suspended", conditions=conditions), events


def backoff_exhausted(
    status: Mapping[str, Any],
    conditions: list,
    desired: Mapping[str, int],
    restarts: Mapping[str, int],
    why: str,
    now: float,
    reason: str = "BackoffLimitExceeded",
) -> tuple[Status, Events]:
    """Failed: past backoffLimit, or at once for a failure no retry mends (`reason` BadInput,
    RefitParityFailed or OOMKilled)."""
    conditions = set_condition(conditions, FAILED, "True", reason, why, now)
    conditions = set_condition(conditions, READY, "False", reason, why, now)
    roles = role_counts(desired, [], restarts)
    new = with_roles(
        status, roles, phase="Failed", message=why, conditions=conditions, completionTime=timestamp(now)
    )
    return new, [("Warning", reason, why)]


def progress_status(
    status: Mapping[str, Any],
    base: Status,
    progress: JobStatus | None,
    gateway: str | None,
    total_steps: int | None,
    now: float = 0.0,
) -> tuple[Status, Events]:
    """The coordinator's progress copied in (the step never down); blocked volunteers counted (never
    down) with one Event each; the time the reported step last moved kept for the stall watchdog."""
    new = dict(base)
    events: Events = []
    if gateway:
        new["volunteerGateway"] = gateway
    else:
        new.pop("volunteerGateway", None)
    if progress is not None:
        new.update(progress_fields(progress))
        # The step shown never goes back: a restarted learner reports 0, then its checkpoint's step,
        # while the job has already reached more. The stall watchdog's clock follows the reported step.
        new["step"] = max(int(status.get("step") or 0), progress.step)
        new["reportedStep"] = progress.step
        previous = status.get("reportedStep", status.get("step"))
        if progress.step != previous or not status.get("lastProgressTime"):
            new["lastProgressTime"] = timestamp(now)
        step_seconds = sum(seconds for _, seconds in progress.phase_seconds)
        if step_seconds > 0:
            new["stepSeconds"] = round(step_seconds, 3)
        already = int(status.get("blockedPeers") or 0)
        for peer_id, reason in newly_blocked(already, progress):
            events.append(("Warning", "VolunteerBlocked", f"peer {peer_id} blocked: {reason}"))
        new["blockedPeers"] = max(already, len(progress.blocked_peers))
    if total_steps and not new.get("totalSteps"):
        new["totalSteps"] = total_steps
    return new, events


def with_final_report(status: Mapping[str, Any], learner: Mapping[str, Any] | None) -> Status:
    """The progress the learner wrote as its termination message when it finished (its last step may
    have come after the last poll of its coordinator); kept only when it is not behind `.status`."""
    out = dict(status)
    for container in ((learner or {}).get("status") or {}).get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated") or {}
        final = read_final(str(ended.get("message") or ""))
        if final and final["step"] >= int(out.get("step") or 0):
            out.update(final)
    return out


def succeeded(new: Status, conditions: list, now: float) -> tuple[Status, Events]:
    conditions = set_condition(conditions, SUCCEEDED, "True", "TrainingComplete", "training finished", now)
    conditions = set_condition(conditions, READY, "False", "Completed", "training finished", now)
    new = {
        **new,
        "phase": "Succeeded",
        "message": "training finished",
        "conditions": conditions,
        "completionTime": timestamp(now),
    }
    return new, [("Normal", "Succeeded", "training finished")]


def coordinator_failed(
    new: Status, conditions: list, now: float, progress: JobStatus | None = None
) -> tuple[Status, Events]:
    """Failed as the coordinator says: with its words and the failure's kind when it gives them (a
    refit-parity verdict names the workers and the version), else in general terms."""
    said = progress.failure if progress is not None else ""
    reason = (progress.failure_reason if progress is not None else "") or "CoordinatorFailed"
    message = "the coordinator reports the training failed" + (f": {said}" if said else "")
    conditions = set_condition(conditions, FAILED, "True", reason, message, now)
    new = {
        **new,
        "phase": "Failed",
        "message": message,
        "conditions": conditions,
        "completionTime": timestamp(now),
    }
    return new, [("Warning", reason, message)]


def running(
    new: Status,
    conditions: list,
    refused: bool,
    now: float,
    queued: tuple[str, str] | None = None,
    unplaced: list[str] | None = None,
    unpulled: list[tuple[str, str]] | None = None,
) -> tuple[Status, Events]:
    """Running once every worker was ready at least once (startTime), else Pending; Queued (with its
    reason) while a gang scheduler or an admission queue holds pods that are not all ready. Pods the
    scheduler cannot place (`unplaced`, status/scheduling.py) set the Unschedulable condition and the
    message, with one Event when that changes; containers waiting on an image the kubelet cannot pull
    (`unpulled`, status/image_pulls.py) set the ImagePullFailed condition, with one Event when it is
    first set (the kubelet's reason alternates between ErrImagePull and ImagePullBackOff meanwhile)."""
    roles = new.get("roles") or {}
    ready = sum(r["ready"] for r in roles.values())
    total = sum(r["desired"] for r in roles.values())
    new = dict(new)
    all_ready = bool(total) and ready == total
    if all_ready:
        conditions = set_condition(
            conditions, READY, "True", "AllWorkersReady", f"{ready}/{total} ready", now
        )
        new.setdefault("startTime", timestamp(now))
    else:
        conditions = set_condition(
            conditions, READY, "False", "WorkersNotReady", f"{ready}/{total} workers ready", now
        )
    phase = "Running" if new.get("startTime") else "Pending"
    message = "spec change refused" if refused else ""
    events: Events = []
    if queued is not None and not all_ready:
        reason, why = queued
        if new.get("phase") != "Queued":
            events.append(("Normal", "Queued", why))
        phase, message = "Queued", why
        conditions = set_condition(conditions, QUEUED, "True", reason, why, now)
    else:
        conditions = drop_condition(conditions, QUEUED)
    if unplaced:
        why = _first_of(unplaced)
        before = condition(conditions, UNSCHEDULABLE)
        if before is None or before.get("message") != why:
            events.append(("Warning", "Unschedulable", why))
        conditions = set_condition(conditions, UNSCHEDULABLE, "True", "Unschedulable", why, now)
        message = why
    else:
        conditions = drop_condition(conditions, UNSCHEDULABLE)
    if unpulled:
        reason = unpulled[0][0]
        why = _first_of([line for _, line in unpulled])
        if condition(conditions, IMAGE_PULL_FAILED) is None:
            events.append(("Warning", IMAGE_PULL_FAILED, why))
        conditions = set_condition(conditions, IMAGE_PULL_FAILED, "True", reason, why, now)
        message = message if unplaced else why
    else:
        conditions = drop_condition(conditions, IMAGE_PULL_FAILED)
    new.update(phase=phase, message=message, conditions=conditions)
    return new, events


def _first_of(lines: list[str]) -> str:
    """The first of several pods' lines, saying how many more there are."""
    return lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
