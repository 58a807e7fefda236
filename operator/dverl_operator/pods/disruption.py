"""Whether a pod ended because the cluster took it away (preemption, eviction) rather than because the
worker failed. Such an end is handled like any failure (replaced; a learner takes its gang with it) but
does not spend `backoffLimit` and waits no backoff, as JobSet's failure-policy rules treat them. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DISRUPTION_CONDITION = "DisruptionTarget"
"""Set by Kubernetes on a pod it is about to take away: preemption by the scheduler (or by Kueue),
eviction through the API, taint-based eviction, the kubelet's node-pressure eviction, pod GC."""
DISRUPTION_REASONS = ("Preempted", "Evicted")
"""`status.reason` of a pod that ended for these (kubelets before the condition existed set only this)."""


def disruption(pod: Mapping[str, Any]) -> str | None:
    """Why the cluster took the pod away (`PreemptionByScheduler: ...`), or None for a pod of its own end."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == DISRUPTION_CONDITION and condition.get("status") == "True":
            reason = condition.get("reason") or DISRUPTION_CONDITION
            message = condition.get("message") or ""
            return f"{reason}: {message}" if message else reason
    reason = status.get("reason")
    if reason in DISRUPTION_REASONS:
        message = status.get("message") or ""
        return f"{reason}: {message}" if message else reason
    return None


def event_reason(why: str) -> str:
    """`Preempted` for a preemption (by the scheduler, or `Preempted` from Kueue), else `Evicted`: the
    kubelet's node-pressure eviction (`TerminationByKubelet`), the Eviction API, a taint, pod GC."""
    return "Preempted" if "preempt" in why.lower() else "Evicted"
