"""Pure: the condition types and phases the operator writes on an RLHFJob, and how a condition is set,
dropped or read (its lastTransitionTime moves only when its status flips)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dverl_operator.objects.times import timestamp

# Condition types the operator writes.
READY = "Ready"
SUSPENDED = "Suspended"
VALIDATION_FAILED = "ValidationFailed"
SPEC_CHANGE_REFUSED = "SpecChangeRefused"
FAILED = "Failed"
SUCCEEDED = "Succeeded"
RESTARTING = "Restarting"
QUEUED = "Queued"
CREATE_REFUSED = "CreateRefused"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL_FAILED = "ImagePullFailed"

TERMINAL_PHASES = ("Succeeded", "Failed")


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
