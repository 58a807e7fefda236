"""`spec.algorithm`: a preset by name, and every choice it makes overridable, each name-valued choice
drawn from the catalogue (`catalogue/algorithms.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from decentralized_verl.spec.base import Fraction, SpecModel, registered_name
from decentralized_verl.spec.catalogue.algorithms import (
    ADVANTAGE_ESTIMATOR_NAMES,
    KL_ESTIMATOR_NAMES,
    LOSS_AGGREGATION_NAMES,
    POLICY_LOSS_NAMES,
    PRESETS,
)

AlgorithmName = registered_name("algorithm", tuple(PRESETS))
AdvantageEstimatorName = registered_name("estimator", ADVANTAGE_ESTIMATOR_NAMES)
PolicyLossName = registered_name("policy loss", POLICY_LOSS_NAMES)
LossAggregationName = registered_name("aggregation", LOSS_AGGREGATION_NAMES)
KlEstimatorName = registered_name("KL estimator", KL_ESTIMATOR_NAMES)


class DynamicFilterSpec(SpecModel):
    """DAPO dynamic sampling: drop prompt groups whose success rate is outside [low, high]."""

    enabled: bool = False
    """Turn DAPO dynamic sampling on."""
    low: Fraction = 0.01
    """Drop groups whose success rate is below this."""
    high: Fraction = 0.99
    """Drop groups whose success rate is above this."""

    @model_validator(mode="after")
    def _ordered(self) -> DynamicFilterSpec:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class OverlongSpec(SpecModel):
    """DAPO soft overlong punishment over the last `cacheLength` tokens before maxNewTokens."""

    enabled: bool = False
    """Turn the soft overlong punishment on."""
    cache_length: PositiveInt | None = None
    """Tokens before maxNewTokens over which the penalty ramps up (must be < data.maxNewTokens)."""
    penalty_factor: Annotated[float, Field(ge=0)] = 1.0
    """Penalty at maxNewTokens, subtracted from the reward."""


CorrectionLevel = Literal["off", "token", "sequence"]


class RolloutCorrectionSpec(SpecModel):
    """Correct for the rollout engine's log-probs differing from the learner's (and for staleness).

    The learner recomputes the batch's log-probs at its current weights; the loss's ratio is taken against
    those, and rho = learner / rollout per token is truncated into an importance weight (TIS) or used to
    reject tokens or samples outside [rejectLow, rejectHigh] (MIS / IcePop). Default: on (token TIS,
    cap 2) with the vllm rollout backend, off with hf, whose kernels are the learner's.
    """

    enabled: bool = Field(
        default=True, description="false: the loss's ratio is against the rollout's log-probs"
    )
    importance_sampling: CorrectionLevel = Field(
        default="token", description="Truncated importance weight per token, per sequence, or off"
    )
    cap: Annotated[float, Field(ge=1)] = Field(default=2.0, description="TIS truncation threshold")
    rejection: CorrectionLevel = Field(
        default="off", description="Drop tokens (or samples) whose ratio leaves [rejectLow, rejectHigh]"
    )
    reject_low: Annotated[float, Field(gt=0)] = 0.5
    """Lower edge of the accepted ratio band (<= 1)."""
    reject_high: Annotated[float, Field(gt=0)] = 2.0
    """Upper edge of the accepted ratio band (>= 1)."""


class AlgorithmSpec(SpecModel):
    name: AlgorithmName = Field(description="The preset: advantage estimator, clipping, filters and losses")
    advantage_estimator: AdvantageEstimatorName | None = Field(
        default=None, description="Override the preset's estimator"
    )
    policy_loss: PolicyLossName | None = Field(default=None, description="Override the preset's policy loss")
    samples_per_prompt: PositiveInt = 8
    """Responses sampled per prompt (a group); group estimators need >= 2."""
    clip_low: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None,
        description="Lower clip range; default the policy loss's (gspo 3e-4, cispo none), else 0.2",
    )
    clip_high: Annotated[float, Field(gt=0, lt=10)] | None = None
    """Upper clip range (DAPO's clip-higher); default the policy loss's, else the preset's."""
    dual_clip: Annotated[float, Field(gt=1)] | None = None
    """Dual-clip constant c > 1: bounds the loss of negative-advantage tokens at c times the advantage."""
    skip_threshold: Annotated[float, Field(gt=1)] | None = None
    """Skip a sample whose mean ratio over its tokens exceeds this (guards off-policy outliers)."""
    loss_aggregation: LossAggregationName | None = None
    """How token losses become the batch loss; default the policy loss's, else the preset's."""
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the KL penalty against the reference model; > 0 needs roles.reference."""
    kl_estimator: KlEstimatorName = "k3"
    """Estimator of the per-token KL to the reference (k1, k2, k3, ...)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where the KL penalty goes: into the loss, or subtracted from the reward."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the entropy bonus in the loss."""
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Discount factor of GAE (ppo)."""
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    """GAE lambda (ppo): bias/variance trade-off of the advantage."""
    value_clip: Annotated[float, Field(gt=0)] = 0.2
    """Clip range of the critic's value loss (ppo)."""
    norm_adv_by_std: bool | None = None
    """Divide group advantages by the group's standard deviation (default: the preset's)."""
    whiten_advantages: bool | None = Field(
        default=None, description="Whiten advantages over the batch's tokens (default: on for ppo's GAE)"
    )
    rollout_correction: RolloutCorrectionSpec | None = Field(
        default=None, description="Rollout/learner mismatch correction (default: on with a vllm rollout)"
    )
    top_k: PositiveInt | None = Field(default=None, description="Keep the k best candidates per prompt")
    dynamic_filter: DynamicFilterSpec | None = None
    """DAPO dynamic sampling: keep only prompt groups with mixed success."""
    overlong: OverlongSpec | None = None
    """DAPO soft overlong punishment near maxNewTokens."""
    mask_truncated: bool | None = None
    """Leave responses cut at maxNewTokens out of the loss (default: the preset's)."""
    ppo_epochs: PositiveInt = 1
    """Passes over each batch of rollouts per step."""
