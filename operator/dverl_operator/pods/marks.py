"""What every pod of a job carries for the cluster's shared schedulers: gang membership, Kueue's queue
and pod group, the scheduler and the priority class. Pure; put together once per pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.planning.plan import Plan
from decentralized_verl.spec import JobSpec
from dverl_operator.children import gang, kueue


@dataclass(frozen=True)
class PodMarks:
    """What the cluster's shared schedulers read on a pod."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    priority_class_name: str | None = None


def for_job(spec: JobSpec, job: Mapping[str, Any], plan: Plan, group: kueue.PodGroup | None) -> PodMarks:
    """`group`: the job's Kueue pod group when it is queued through Kueue, else None."""
    name = (job.get("metadata") or {})["name"]
    labels, annotations = gang.pod_marks(spec, name)
    queue = kueue.queue_name(job)
    if queue is not None and group is not None:
        queue_labels, queue_annotations = kueue.pod_marks(group, queue)
        labels = {**labels, **queue_labels}
        annotations = {**annotations, **queue_annotations}
    return PodMarks(
        labels=labels,
        annotations=annotations,
        scheduler_name=gang.scheduler_name(spec),
        priority_class_name=spec.priority_class_name,
    )
