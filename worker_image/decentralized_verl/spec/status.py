"""`.status` of an RLHFJob: what the operator writes (phase, conditions, printer columns), never a user.

Not to be confused with `core.status.JobStatus`, the coordinator's progress, which the operator reads and
copies into some of these fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

from decentralized_verl.spec.base import SpecModel


class Condition(SpecModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class RoleStatus(SpecModel):
    ready: NonNegativeInt = 0
    desired: NonNegativeInt = 0
    restarts: NonNegativeInt = 0


class KueuePodGroup(SpecModel):
    name: str
    total_count: NonNegativeInt = 0
    finished: bool = Field(default=False, description="marked not to be retried: its quota is released")


class RLHFJobStatus(SpecModel):
    """Written only by the operator; backs the printer columns of `kubectl get rlhfjobs`."""

    phase: Literal["Pending", "Queued", "Running", "Succeeded", "Failed", "Suspended"] = "Pending"
    message: str = ""
    conditions: list[Condition] = Field(default_factory=list)
    roles: dict[str, RoleStatus] = Field(default_factory=dict)
    workers: str = Field(default="0/0", description="ready/desired workers, for the printer column")
    volunteers: NonNegativeInt = 0
    blocked_peers: NonNegativeInt = Field(
        default=0, description="volunteers blocked for this job after failing verification (job lifetime)"
    )
    volunteer_gateway: str | None = Field(
        default=None, description="host:port of the job's DHT bootstrap peer as volunteers outside reach it"
    )
    step: NonNegativeInt = 0
    total_steps: NonNegativeInt = 0
    reward: float | None = None
    kl: float | None = None
    policy_version: NonNegativeInt = 0
    tokens_per_second: float | None = None
    eval_accuracy: float | None = None
    last_checkpoint: str | None = None
    last_progress_time: str | None = Field(
        default=None, description="when the reported step last advanced (the learner stall watchdog's clock)"
    )
    step_seconds: float | None = Field(default=None, description="the last step's duration, as reported")
    kueue_pod_group: KueuePodGroup | None = Field(
        default=None, description="the Kueue pod group (its Workload's name) of the job's current run"
    )
    observed_generation: NonNegativeInt = 0
    start_time: str | None = None
    completion_time: str | None = None
