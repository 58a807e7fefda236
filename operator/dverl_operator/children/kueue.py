"""Kueue admission for the job's pods: one pod group per run of the job, admitted as one Workload. Pure.

Kueue manages plain pods that carry its queue label; `kueue.x-k8s.io/pod-group-name` plus the
`pod-group-total-count` annotation make it admit them together as one Workload named after the group.
Its webhook holds each new pod behind a scheduling gate until the Workload is admitted (the job is
`Queued` meanwhile), and on preemption it deletes the group's pods: the operator makes replacements in
the same group, which Kueue queues again. A group ends (quota released) once a pod of it carries
`retriable-in-group: "false"` and none still runs: the operator marks its pods so when the job is
suspended, fails, finishes or changes size. A Workload keeps its group's name, so each new run of the
job (after a suspend, or at a new size) gets a new group name, chained from the last one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dverl_operator.objects.pod_state import pod_deleting

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
STATUS_KEY = "kueuePodGroup"

Patch = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class PodGroup:
    name: str
    total_count: int
    finished: bool = False

    def to_status(self) -> dict[str, Any]:
        return {"name": self.name, "totalCount": self.total_count, "finished": self.finished}

    @staticmethod
    def from_status(status: Mapping[str, Any]) -> PodGroup | None:
        recorded = status.get(STATUS_KEY)
        if not isinstance(recorded, Mapping) or not recorded.get("name"):
            return None
        return PodGroup(
            str(recorded["name"]), int(recorded.get("totalCount") or 0), bool(recorded.get("finished"))
        )


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue the RLHFJob asks for (its own label, as for a Kubernetes Job)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = labels.get(QUEUE_LABEL)
    return str(value) if value else None


def current_group(status: Mapping[str, Any], job: str, uid: str, total: int) -> PodGroup:
    """The group the job's pods belong to now: the recorded one while it is open and of this size, else
    the next one. Deterministic, so a pass repeated after a crash picks the same name."""
    recorded = PodGroup.from_status(status)
    if recorded is not None and not recorded.finished and recorded.total_count == total:
        return recorded
    seed = json.dumps([uid, total, recorded.name if recorded is not None else None])
    return PodGroup(f"{job}-{hashlib.sha256(seed.encode()).hexdigest()[:6]}", total)


def pod_marks(group: PodGroup, queue: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that queue a pod in `queue` as a member of `group`."""
    return (
        {QUEUE_LABEL: queue, GROUP_LABEL: group.name},
        {TOTAL_ANNOTATION: str(group.total_count)},
    )


def finish(pods: Mapping[str, Mapping[str, Any]], keep: str | None) -> list[Patch]:
    """Mark every Kueue pod outside the group `keep` (all of them when None) as not to be retried, so its
    group's Workload finishes and releases its quota once the pods are gone."""
    patches: list[Patch] = []
    for name, pod in pods.items():
        meta = pod.get("metadata") or {}
        group = (meta.get("labels") or {}).get(GROUP_LABEL)
        if group is None or group == keep:
            continue
        if (meta.get("annotations") or {}).get(RETRIABLE_ANNOTATION) == "false":
            continue
        patches.append(("Pod", name, {"metadata": {"annotations": {RETRIABLE_ANNOTATION: "false"}}}))
    return patches


def held(pods: Mapping[str, Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) while scheduling gates hold pods of the job (Kueue's, before admission)."""
    gates: set[str] = set()
    count = 0
    for pod in pods.values():
        names = [g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        if names and not pod_deleting(pod):
            count += 1
            gates.update(names)
    if not count:
        return None
    reason = (
        "WaitingForAdmission" if any(g.startswith("kueue.x-k8s.io/") for g in gates) else "SchedulingGated"
    )
    return reason, f"{count} pod(s) held by scheduling gate(s) {', '.join(sorted(gates))}"
