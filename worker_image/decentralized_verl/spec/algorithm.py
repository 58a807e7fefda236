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


class AlgorithmSpec(SpecModel):
    name: AlgorithmName = Field(description="The preset: advantage estimator, clipping, filters and losses")
    advantage_estimator: AdvantageEstimatorName | None = Field(
        default=None, description="Override the preset's estimator"
    )
    policy_loss: PolicyLossName | None = Field(default=None, description="Override the preset's policy loss")
    samples_per_prompt: PositiveInt = 8
    clip_low: Annotated[float, Field(gt=0, lt=1)] = 0.2
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
    top_k: PositiveInt | None = Field(default=None, description="Keep the k best candidates per prompt")
    dynamic_filter: DynamicFilterSpec | None = None
    overlong: OverlongSpec | None = None
    mask_truncated: bool | None = None
    ppo_epochs: PositiveInt = 1
