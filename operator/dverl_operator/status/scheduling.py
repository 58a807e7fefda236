"""Pure: pods the scheduler cannot place, in the scheduler's own words.

A pod asking for more GPUs, CPU or memory than any node has free, or for a node selector or toleration no
node matches, stays Pending with `PodScheduled=False, reason=Unschedulable` and a message such as
`0/3 nodes are available: 3 Insufficient nvidia.com/gpu`. The job's `Unschedulable` condition and
message carry that line with the pod and role, so `kubectl get rlhfjobs` says why nothing runs.

In a gang, the pods that would fit wait on their siblings, and the gang scheduler says only that
(coscheduling: `rejected due to timeout after waiting 1m0s at plugin Coscheduling`); the sibling no node
can take holds the reason a person can act on, so such lines come first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator.objects.pod_state import pod_deleting, pod_phase, role_of

UNSCHEDULABLE_REASON = "Unschedulable"
WAITING_ON_THE_GANG = (
    "at plugin Coscheduling",  # coscheduling's Permit timeout
    "cannot find enough sibling pods",  # coscheduling's PreFilter
    "tasks in gang unschedulable",  # Volcano
)
"""What a gang scheduler says of a pod held back only for its siblings."""


def waits_on_the_gang(message: str) -> bool:
    return any(words in message for words in WAITING_ON_THE_GANG)


def unschedulable(pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per Pending pod the scheduler could not place: `pod NAME (ROLE): MESSAGE`, the pods no
    node can take before those held only for their gang."""
    lines: list[tuple[bool, str]] = []
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
                line = f"pod {name} ({role_of(pod)}) cannot be scheduled: {said}"
                lines.append((waits_on_the_gang(said), line))
    return [line for _, line in sorted(lines, key=lambda item: item[0])]
