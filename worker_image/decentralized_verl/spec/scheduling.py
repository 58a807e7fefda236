"""`spec.scheduling` and `spec.priorityClassName`: how the job shares a cluster with others.

A gang (a scheduler-plugins coscheduling or a Volcano PodGroup) makes the scheduler place the job's pods
all together or not at all, so two half-placed jobs never hold GPUs waiting for each other. Kueue needs no
field here: the `kueue.x-k8s.io/queue-name` label on the RLHFJob itself asks for admission through that
LocalQueue, as it does for a Kubernetes Job.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from decentralized_verl.spec.base import SpecModel

GangScheduler = Literal["coscheduling", "volcano"]
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class GangSpec(SpecModel):
    scheduler: GangScheduler = Field(
        description=(
            "coscheduling: a scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1); volcano: a Volcano "
            "PodGroup (scheduling.volcano.sh/v1beta1)"
        )
    )
    schedule_timeout_seconds: PositiveInt | None = Field(
        default=None,
        description="coscheduling: how long a partly placed gang may wait before its pods are retried (60)",
    )
    queue: str | None = Field(
        default=None, min_length=1, max_length=253, description="volcano: the Volcano Queue (its default)"
    )
    min_rollout: NonNegativeInt | None = Field(
        default=None,
        description=(
            "Rollout replicas that must start together with the learners (every one when omitted); the "
            "rest join as the cluster frees room. Volunteers never count."
        ),
    )


class SchedulingSpec(SpecModel):
    gang: GangSpec | None = Field(
        default=None, description="Place the job's pods all together or not at all (gang scheduling)"
    )


PriorityClassName = Field(
    default=None,
    min_length=1,
    max_length=253,
    pattern=DNS_SUBDOMAIN,
    description="PriorityClass of every pod of the job (preemption order on a shared cluster)",
)
