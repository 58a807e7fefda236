"""`spec.training`: steps, batch sizes, optimizer, checkpoints, evaluation, staleness and loggers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from decentralized_verl.spec.base import SpecModel


class CheckpointSpec(SpecModel):
    every: NonNegativeInt | None = Field(
        default=None,
        description=(
            "Checkpoint every N steps; 0 turns checkpoints off; unset: automatic (every step while a "
            "snapshot costs under 5% of the training time, else less often, at least every 10 minutes)"
        ),
    )
    dir: str | None = Field(default=None, description="Checkpoint root; a PVC mount path in a cluster")
    keep: PositiveInt = 2
    """Checkpoints kept; older ones are removed."""
    persistent_volume_claim: str | None = Field(
        default=None,
        description="Existing PVC mounted at `dir` in learner pods (never created or deleted by operator)",
    )


class TrackingSpec(SpecModel):
    """How the experiment trackers of `logging` label and fill a run."""

    project: str = Field(default="dverl", description="W&B project / MLflow experiment")
    run_name: str | None = Field(
        default=None, description="The run's name in every tracker (default: the job name)"
    )
    samples_every: NonNegativeInt = Field(
        default=10, description="Log a table of sample generations every N steps (0: never)"
    )
    samples: PositiveInt = Field(default=8, description="Generations in each samples table")


class TrainingSpec(SpecModel):
    steps: PositiveInt | None = None
    """Learner steps to train (100 when neither steps nor epochs is set)."""
    epochs: PositiveInt | None = None
    """Passes over the training file (instead of steps)."""
    batch_size: PositiveInt = Field(default=8, description="Prompts per learner step per learner replica")
    minibatch_size: PositiveInt | None = None
    """Prompts per optimizer step (batchSize by default); must divide batchSize."""
    microbatch_size: PositiveInt | None = None
    """Prompts per forward/backward pass (gradient accumulation); must divide minibatchSize."""
    microbatch_tokens: PositiveInt | None = Field(
        default=None,
        description=(
            "Pack each learner micro-batch up to this many token positions (a prompt shared by its group "
            "counts once; padding counts) instead of microbatchSize prompts; rows of like length go "
            "together and the loss is the same"
        ),
    )
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 1e-6
    """Adam learning rate of the policy."""
    critic_learning_rate: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Learning rate of the critic (the policy's when omitted)."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW weight decay."""
    warmup_steps: NonNegativeInt = 0
    """Steps of linear learning-rate warm-up."""
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradients are clipped to this global norm."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Where and how often the learner saves checkpoints (a job resumes from the last)."""
    eval_every: NonNegativeInt = 0
    """Evaluate on data.eval every N steps; 0: never."""
    max_staleness: NonNegativeInt = 0
    """Policy versions a rollout may lag behind the learner (0: on-policy, synchronous)."""
    stall_factor: Annotated[float, Field(gt=1)] = Field(
        default=10.0,
        description="Restart a learner whose step has not advanced for this many times its step time",
    )
    refit_parity_bound: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description=(
            "Fail the job when, after a weight refresh, the rollout's log-probs differ from the learner's on "
            "the same tokens by more than this on average (mean absolute difference per token; measured "
            "every step either way: refit_logprob_diff_mean/max). E.g. 0.05 for a bf16 engine; a broken "
            "refresh differs by whole nats"
        ),
    )
    seed: NonNegativeInt = 0
    """Seed of sampling and data order."""
    logging: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Trackers fed every step's metrics (pip install 'decentralized-verl[trackers]')",
    )
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSpec:
        if self.steps is None and self.epochs is None:
            self.steps = 100
        return self
