"""`spec.algorithm`: a preset by name, and every choice it makes overridable, each name-valued choice
drawn from the algorithm registries."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from decentralized_verl.algorithms.presets import PRESETS
from decentralized_verl.algorithms.registry import (
    ADVANTAGE_ESTIMATOR_NAMES,
    KL_ESTIMATOR_NAMES,
    LOSS_AGGREGATION_NAMES,
    POLICY_LOSS_NAMES,
)
from decentralized_verl.spec.base import Fraction, SpecModel, registered_name

AlgorithmName = registered_name("algorithm", tuple(PRESETS))
AdvantageEstimatorName = registered_name("estimator", ADVANTAGE_ESTIMATOR_NAMES)
PolicyLossName = registered_name("policy loss", POLICY_LOSS_NAMES)
LossAggregationName = registered_name("aggregation", LOSS_AGGREGATION_NAMES)
KlEstimatorName = registered_name("KL estimator", KL_ESTIMATOR_NAMES)


class DynamicFilterSpec(SpecModel):
    """DAPO dynamic sampling: drop prompt groups whose success rate is outside [low, high]."""

    enabled: bool = False
    low: Fraction = 0.01
    high: Fraction = 0.99

    @model_validator(mode="after")
    def _ordered(self) -> DynamicFilterSpec:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class OverlongSpec(SpecModel):
    """DAPO soft overlong punishment over the last `cacheLength` tokens before maxNewTokens."""

    enabled: bool = False
    cache_length: PositiveInt | None = None
    penalty_factor: Annotated[float, Field(ge=0)] = 1.0


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
    reject_high: Annotated[float, Field(gt=0)] = 2.0


class AlgorithmSpec(SpecModel):
    name: AlgorithmName = Field(description="The preset: advantage estimator, clipping, filters and losses")
    advantage_estimator: AdvantageEstimatorName | None = Field(
        default=None, description="Override the preset's estimator"
    )
    policy_loss: PolicyLossName | None = Field(default=None, description="Override the preset's policy loss")
    samples_per_prompt: PositiveInt = 8
    clip_low: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None,
        description="Lower clip range; default the policy loss's (gspo 3e-4, cispo none), else 0.2",
    )
    clip_high: Annotated[float, Field(gt=0, lt=10)] | None = None
    dual_clip: Annotated[float, Field(gt=1)] | None = None
    skip_threshold: Annotated[float, Field(gt=1)] | None = None
    loss_aggregation: LossAggregationName | None = None
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: KlEstimatorName = "k3"
    kl_in: Literal["loss", "reward"] = "loss"
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    value_clip: Annotated[float, Field(gt=0)] = 0.2
    norm_adv_by_std: bool | None = None
    whiten_advantages: bool | None = Field(
        default=None, description="Whiten advantages over the batch's tokens (default: on for ppo's GAE)"
    )
    rollout_correction: RolloutCorrectionSpec | None = Field(
        default=None, description="Rollout/learner mismatch correction (default: on with a vllm rollout)"
    )
    top_k: PositiveInt | None = Field(default=None, description="Keep the k best candidates per prompt")
    dynamic_filter: DynamicFilterSpec | None = None
    overlong: OverlongSpec | None = None
    mask_truncated: bool | None = None
    ppo_epochs: PositiveInt = 1
