"""Pure: pods the scheduler cannot place, in the scheduler's own words.

A pod asking for more GPUs, CPU or memory than any node has free, or for a node selector or toleration no
node matches, stays Pending with `PodScheduled=False, reason=Unschedulable` and a message such as
`0/3 nodes are available: 3 Insufficient nvidia.com/gpu`. The job's `Unschedulable` condition and
message carry that line with the pod and role, so `kubectl get rlhfjobs` says why nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator.objects.pod_state import pod_deleting, pod_phase, role_of

UNSCHEDULABLE_REASON = "Unschedulable"


def unschedulable(pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per Pending pod the scheduler could not place: `pod NAME (ROLE): MESSAGE`."""
    lines = []
    for name, pod in sorted(pods.items()):
        if pod_deleting(pod) or pod_phase(pod) != "Pending":
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == UNSCHEDULABLE_REASON
            ):
                said = " ".join(str(condition.get("message") or "no node fits").split())
                lines.append(f"pod {name} ({role_of(pod)}) cannot be scheduled: {said}")
    return lines
