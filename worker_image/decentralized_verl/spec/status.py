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
    """Condition type, e.g. Ready, ValidationFailed, Restarting."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = ""
    """One-word reason for the last transition."""
    message: str = ""
    """What happened, for people."""
    last_transition_time: str | None = None
    """When the status last changed (RFC 3339)."""


class RoleStatus(SpecModel):
    ready: NonNegativeInt = 0
    """Workers of the role running and ready."""
    desired: NonNegativeInt = 0
    """Workers the role should have."""
    restarts: NonNegativeInt = 0
    """Restarts of the role so far."""


class KueuePodGroup(SpecModel):
    name: str
    """Name of the pod group (its Kueue Workload)."""
    total_count: NonNegativeInt = 0
    """Pods in the group."""
    finished: bool = Field(default=False, description="marked not to be retried: its quota is released")


class RefitParityStatus(SpecModel):
    """The rollout's log-probs against the learner's on the same tokens after the last measured refresh."""

    mean_abs_diff: float = Field(ge=0, description="mean absolute log-prob difference per token, in nats")
    max_abs_diff: float = Field(ge=0, description="largest absolute log-prob difference of any token")
    version: NonNegativeInt = Field(description="the policy version whose refresh was compared")
    tokens: NonNegativeInt = 0
    """Tokens compared."""


class RLHFJobStatus(SpecModel):
    """Written only by the operator; backs the printer columns of `kubectl get rlhfjobs`."""

    phase: Literal["Pending", "Queued", "Running", "Succeeded", "Failed", "Suspended"] = "Pending"
    """Pending, Queued, Running, Succeeded, Failed or Suspended."""
    message: str = ""
    """Why the job is in its phase, for people."""
    conditions: list[Condition] = Field(default_factory=list)
    """The job's conditions (Ready, ValidationFailed, Restarting, ...)."""
    roles: dict[str, RoleStatus] = Field(default_factory=dict)
    """Workers ready and desired per role, with restarts."""
    workers: str = Field(default="0/0", description="ready/desired workers, for the printer column")
    volunteers: NonNegativeInt = 0
    """Volunteers taking part now."""
    blocked_peers: NonNegativeInt = Field(
        default=0, description="volunteers blocked for this job after failing verification (job lifetime)"
    )
    volunteer_gateway: str | None = Field(
        default=None, description="host:port of the job's DHT bootstrap peer as volunteers outside reach it"
    )
    step: NonNegativeInt = 0
    """Learner steps done: the most the job has reached, never lower after a learner restarts from an
    older checkpoint."""
    reported_step: NonNegativeInt = Field(
        default=0,
        description="the step the coordinator reports now (below step while a restarted learner catches up)",
    )
    total_steps: NonNegativeInt = 0
    """Learner steps the job will train."""
    reward: float | None = None
    """Mean reward of the last step."""
    kl: float | None = None
    """Mean KL to the reference of the last step."""
    policy_version: NonNegativeInt = 0
    """Version of the policy weights rollout workers have."""
    tokens_per_second: float | None = None
    """Generated tokens per second over the last step."""
    eval_accuracy: float | None = None
    """Accuracy of the last evaluation."""
    refit_parity: RefitParityStatus | None = Field(
        default=None, description="the latest refit parity the coordinator measured (rollout vs learner)"
    )
    last_checkpoint: str | None = None
    """Path of the last checkpoint written."""
    last_progress_time: str | None = Field(
        default=None, description="when the reported step last advanced (the learner stall watchdog's clock)"
    )
    step_seconds: float | None = Field(default=None, description="the last step's duration, as reported")
    kueue_pod_group: KueuePodGroup | None = Field(
        default=None, description="the Kueue pod group (its Workload's name) of the job's current run"
    )
    observed_generation: NonNegativeInt = 0
    """metadata.generation of the spec the operator last acted on."""
    start_time: str | None = None
    """When the job started running (RFC 3339)."""
    completion_time: str | None = None
    """When the job succeeded or failed (RFC 3339)."""
