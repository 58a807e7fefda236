"""Pure: observed pods + coordinator progress -> the RLHFJob's `.status` (phase, conditions, columns).

The operator is the only writer of `.status`, and it writes only what changed (a JSON merge patch built
by `merge_patch`), so an unchanged job costs no write and no watch event.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from decentralized_verl.core.status import JobStatus
from dverl_operator.owned import LABEL_ROLE

# Condition types the operator writes.
READY = "Ready"
SUSPENDED = "Suspended"
VALIDATION_FAILED = "ValidationFailed"
SPEC_CHANGE_REFUSED = "SpecChangeRefused"
FAILED = "Failed"
SUCCEEDED = "Succeeded"
RESTARTING = "Restarting"
QUEUED = "Queued"

TERMINAL_PHASES = ("Succeeded", "Failed")


def timestamp(now: float) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch from an RFC 3339 UTC time as Kubernetes writes it; None when absent."""
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def set_condition(
    conditions: Iterable[Mapping[str, Any]], kind: str, status: str, reason: str, message: str, now: float
) -> list[dict[str, Any]]:
    """Upsert one condition; its lastTransitionTime moves only when its status flips."""
    result: list[dict[str, Any]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != kind:
            result.append(dict(condition))
            continue
        found = True
        moved = condition.get("status") != status
        result.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": timestamp(now) if moved else condition.get("lastTransitionTime"),
            }
        )
    if not found:
        result.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": timestamp(now),
            }
        )
    return result


def drop_condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions if c.get("type") != kind]


def condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Any] | None:
    for item in conditions:
        if item.get("type") == kind:
            return dict(item)
    return None


# ------------------------------------------------------------------------------------------- pods
def pod_phase(pod: Mapping[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready as the kubelet reports it: phase Running and condition Ready=True."""
    if pod_phase(pod) != "Running":
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def role_of(pod: Mapping[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, "")


def role_counts(
    desired: Mapping[str, int], pods: Iterable[Mapping[str, Any]], restarts: Mapping[str, int]
) -> dict[str, dict[str, int]]:
    """Per role: ready pods (not being deleted), desired pods, restarts so far."""
    ready: dict[str, int] = dict.fromkeys(desired, 0)
    for pod in pods:
        role = role_of(pod)
        if role in ready and pod_ready(pod) and not pod_deleting(pod):
            ready[role] += 1
    return {
        role: {"ready": ready[role], "desired": count, "restarts": int(restarts.get(role, 0))}
        for role, count in desired.items()
    }


def workers_column(roles: Mapping[str, Mapping[str, int]]) -> str:
    ready = sum(r["ready"] for r in roles.values())
    desired = sum(r["desired"] for r in roles.values())
    return f"{ready}/{desired}"


# ---------------------------------------------------------------------------------------- progress
def progress_fields(progress: JobStatus) -> dict[str, Any]:
    """The `.status` fields (camelCase) the coordinator's reported progress sets; the step's numbers
    (reward, KL, tokens/s) only once a step has finished."""
    out: dict[str, Any] = {
        "step": progress.step,
        "totalSteps": progress.total_steps,
        "policyVersion": progress.policy_version,
        "volunteers": progress.volunteers,
    }
    reported = progress.reported
    for key, value in (
        ("reward", progress.reward_mean if reported else None),
        ("kl", progress.kl if reported else None),
        ("tokensPerSecond", progress.tokens_per_second if reported else None),
        ("lastCheckpoint", progress.last_checkpoint or None),
        ("evalAccuracy", progress.eval_accuracy),
    ):
        if value is not None:
            out[key] = round(value, 6) if isinstance(value, float) else value
    return out


def newly_blocked(previous_count: int, progress: JobStatus) -> list[tuple[str, str]]:
    """Peers blocked since the count in `.status` was written (the coordinator lists them in order).

    `.status.blockedPeers` is a job-lifetime counter: it never goes down, so a learner restart (whose
    blocklist starts empty) does not make the operator announce the same peers twice.
    """
    return list(progress.blocked_peers[previous_count:])


# ------------------------------------------------------------------------------------ merge patch
def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch turning `old` into `new` (None deletes a key); {} when equal."""
    old = old or {}
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch
