"""Gang placement, pure: the pods of a PodGroup placed all together or not at all, as the coscheduling
plugin (scheduler-plugins) and Volcano do, so a job whose gang cannot fit runs none of its pods here,
where placing them one by one would start part of it.

What each scheduler says is played from its source: coscheduling's PreFilter refuses a pod whose group
has fewer pods than `minMember` (`pre-filter pod ... cannot find enough sibling pods`); pods that would
fit wait at its Permit stage, unbound and with no condition, until `scheduleTimeoutSeconds` passes, then
are rejected (`rejected due to timeout after waiting 1m0s at plugin Coscheduling`) and retried. Volcano
says at once how much of the gang it cannot place (`3/3 tasks in gang unschedulable: pod group is not
ready, 3 Pending, 3 minAvailable`). A member that fits no node carries the scheduler's own reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
GROUP_PATHS = {
    "coscheduling": "apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    "volcano": "apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups/{name}",
}
DEFAULT_TIMEOUT_SECONDS = 60
"""scheduler-plugins' default when a PodGroup sets no `scheduleTimeoutSeconds`."""

GangKey = tuple[str, str, str]
"""(scheduler, namespace, PodGroup name)."""
Choose = Callable[[Mapping[str, Any], Mapping[str, Sequence[Mapping[str, Any]]]], tuple[str | None, str]]
"""(pod, pods bound to each node so far) -> (node, "") or (None, the scheduler's message)."""


def gang_of(pod: Mapping[str, Any]) -> GangKey | None:
    """The PodGroup a pod belongs to, if any."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    if name := (meta.get("labels") or {}).get(COSCHEDULING_LABEL):
        return ("coscheduling", ns, name)
    if name := (meta.get("annotations") or {}).get(VOLCANO_ANNOTATION):
        return ("volcano", ns, name)
    return None


@dataclass(frozen=True)
class GangPlacement:
    """Where each waiting member goes (empty unless the gang is placed) and, by pod name, the message of
    each member left unplaced (None: it waits without a word, as at coscheduling's Permit)."""

    nodes: Mapping[str, str]
    unplaced: Mapping[str, str | None]


def place(
    key: GangKey,
    group: Mapping[str, Any] | None,
    waiting: Sequence[Mapping[str, Any]],
    live: int,
    bound: Mapping[str, Sequence[Mapping[str, Any]]],
    choose: Choose,
    waited_s: float,
) -> GangPlacement:
    """The gang's waiting members placed together, or none of them.

    `live` counts the group's pods that are not finished or deleting (bound ones too); `bound` holds the
    pods on each node so far; `waited_s` is how long this gang has waited unplaced."""
    scheduler, _, name = key
    names = [p["metadata"]["name"] for p in waiting]
    if group is None:
        return GangPlacement({}, dict.fromkeys(names, f'podgroups "{name}" not found'))
    spec = group.get("spec") or {}
    need = int(spec.get("minMember") or 1)
    if scheduler == "coscheduling" and live < need:
        return GangPlacement(
            {},
            {
                n: f"pre-filter pod {n} cannot find enough sibling pods, current pods number: {live}, "
                f"minMember of group: {need}"
                for n in names
            },
        )
    trial = {node: list(pods) for node, pods in bound.items()}
    nodes: dict[str, str] = {}
    refused: dict[str, str] = {}
    for pod in waiting:
        node, message = choose(pod, trial)
        pod_name = pod["metadata"]["name"]
        if node is None:
            refused[pod_name] = message
            continue
        nodes[pod_name] = node
        trial[node].append({**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}})
    placed_already = live - len(waiting)
    if placed_already + len(nodes) >= need:
        return GangPlacement(nodes, refused)
    if scheduler == "coscheduling":
        timeout = int(spec.get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
        rejected = f"rejected due to timeout after waiting {go_duration(timeout)} at plugin Coscheduling"
        waiting_words = rejected if waited_s >= timeout else None
        return GangPlacement({}, {n: refused.get(n, waiting_words) for n in names})
    unplaceable = len(names)
    said = (
        f"{unplaceable}/{live} tasks in gang unschedulable: pod group is not ready, {live} Pending, "
        f"{need} minAvailable"
    )
    return GangPlacement({}, {n: refused.get(n) or said for n in names})


def go_duration(seconds: int) -> str:
    """Whole seconds as Go prints a time.Duration (`60` -> `1m0s`), as the scheduler's message has it."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def group_path(key: GangKey) -> str:
    scheduler, ns, name = key
    return GROUP_PATHS[scheduler].format(ns=ns, name=name)
