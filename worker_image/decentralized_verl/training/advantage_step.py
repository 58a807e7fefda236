"""Between rollout and update: batch filters, reward shaping and advantages, driven by the spec.

The trainer stays algorithm-blind: everything an algorithm name changes is decided here, through the
registries in `decentralized_verl.algorithms`. Pure functions over `Sample` lists and `TrainBatch`es.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.advantage_inputs import AdvantageInputs
from decentralized_verl.algorithms.filters import (
    dynamic_sampling_keep_mask,
    mask_truncated,
    overlong_penalty,
    top_k_keep_mask,
)
from decentralized_verl.algorithms.kl import kl_in_reward, token_kl
from decentralized_verl.algorithms.masking import masked_mean, masked_whiten
from decentralized_verl.algorithms.rollout_correction import RolloutCorrection
from decentralized_verl.core.samples import Sample, TrainBatch
from decentralized_verl.spec import JobSpec


@dataclass(frozen=True)
class AlgorithmSettings:
    """The spec's algorithm section with the preset's defaults filled in (by the spec's derived settings,
    `spec.sections.JobSections`: the one place they are resolved)."""

    estimator: str
    policy_loss: str
    clip_low: float | None
    """None: no lower clip (CISPO's default)."""
    clip_high: float
    dual_clip: float | None
    skip_threshold: float | None
    aggregation: str
    norm_by_std: bool
    whiten_advantages: bool
    rollout_correction: RolloutCorrection | None
    kl_coef: float
    kl_estimator: str
    kl_in: str
    entropy_coef: float
    gamma: float
    lam: float
    value_clip: float
    dynamic_filter: tuple[float, float] | None
    overlong: tuple[int, float] | None
    mask_truncated: bool
    top_k: int | None
    ppo_epochs: int
    temperature: float

    @classmethod
    def from_spec(cls, spec: JobSpec) -> AlgorithmSettings:
        algo = spec.algorithm
        clip_low, clip_high = spec.clip_range
        correction = spec.rollout_correction
        return cls(
            estimator=spec.advantage_estimator,
            policy_loss=spec.policy_loss,
            clip_low=clip_low,
            clip_high=clip_high,
            dual_clip=algo.dual_clip,
            skip_threshold=algo.skip_threshold,
            aggregation=spec.loss_aggregation,
            norm_by_std=spec.norm_adv_by_std,
            whiten_advantages=spec.whiten_advantages,
            rollout_correction=None
            if correction is None
            else RolloutCorrection(
                importance_sampling=correction.importance_sampling,
                cap=correction.cap,
                rejection=correction.rejection,
                reject_low=correction.reject_low,
                reject_high=correction.reject_high,
            ),
            kl_coef=algo.kl_coef,
            kl_estimator=algo.kl_estimator,
            kl_in=algo.kl_in,
            entropy_coef=algo.entropy_coef,
            gamma=algo.gamma,
            lam=algo.lam,
            value_clip=algo.value_clip,
            dynamic_filter=spec.dynamic_filter,
            overlong=spec.overlong,
            mask_truncated=spec.mask_truncated,
            top_k=algo.top_k,
            ppo_epochs=algo.ppo_epochs,
            temperature=spec.data.temperature if spec.data.temperature > 0 else 1.0,
        )


def select_samples(
    samples: list[Sample], settings: AlgorithmSettings
) -> tuple[list[Sample], dict[str, float]]:
    """Apply the batch filters (top-k candidates, DAPO dynamic sampling); returns kept samples + metrics."""
    if not samples:
        return samples, {}
    scores = torch.tensor([float(s.score or 0.0) for s in samples])
    groups = torch.tensor([s.prompt.group for s in samples])
    keep = torch.ones(len(samples), dtype=torch.bool)
    metrics: dict[str, float] = {}
    if settings.top_k is not None:
        keep &= top_k_keep_mask(scores, groups, settings.top_k)
    if settings.dynamic_filter is not None:
        low, high = settings.dynamic_filter
        successes = (scores > 0.5).float()
        dyn = dynamic_sampling_keep_mask(successes, groups, min_rate=low, max_rate=high, inclusive=True)
        metrics["dynamic_filter_kept"] = float(dyn.float().mean())
        keep &= dyn
    kept = [s for s, k in zip(samples, keep.tolist(), strict=True) if k]
    metrics["samples_kept"] = float(len(kept))
    return kept, metrics


def attach_advantages(batch: TrainBatch, settings: AlgorithmSettings) -> dict[str, float]:
    """Fill `batch.advantages`/`batch.returns` (and shape scores/mask) in place; returns metrics."""
    registry.load()
    metrics: dict[str, float] = {}
    if settings.mask_truncated:
        batch.response_mask = mask_truncated(batch.response_mask, batch.truncated)
    scores = batch.scores.clone()
    if settings.overlong is not None:
        cache, factor = settings.overlong
        max_length = int(batch.response_mask.shape[1])
        max_length = max(max_length, int(batch.response_lengths.max()))
        penalty = overlong_penalty(batch.response_lengths, max_length=max_length, cache_length=cache)
        scores = scores + factor * penalty
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    mask = batch.trained_mask()  # a multi-turn episode's observations are neither scored nor trained
    if bool(mask.any()):
        # The sampled tokens' mean surprise: a Monte Carlo estimate of the policy's token entropy at no
        # cost (the learner's exact entropy replaces it when entropyCoef > 0 computes one).
        metrics["entropy"] = float(-masked_mean(batch.old_logprobs, mask.bool()))
    token_rewards = None
    if batch.ref_logprobs is not None:
        kl = token_kl(batch.old_logprobs, batch.ref_logprobs, mask, settings.kl_estimator)
        metrics["kl"] = float(masked_mean(kl, mask.bool()))
        if settings.kl_coef > 0 and settings.kl_in == "reward":
            base = AdvantageInputs(response_mask=mask, scores=scores).rewards_per_token(mask.bool())
            token_rewards, _ = kl_in_reward(
                base,
                batch.old_logprobs,
                batch.ref_logprobs,
                mask,
                kl_coef=settings.kl_coef,
                estimator=settings.kl_estimator,
            )
    inputs = AdvantageInputs(
        response_mask=mask,
        token_rewards=token_rewards,
        scores=scores,
        values=batch.values,
        group_index=batch.group_index,
    )
    estimator = registry.lookup(registry.ADVANTAGE_ESTIMATORS, "advantage estimator", settings.estimator)
    advantages, returns = estimator(
        inputs, gamma=settings.gamma, lam=settings.lam, norm_by_std=settings.norm_by_std
    )
    if settings.whiten_advantages:
        # After the returns are taken (the critic's targets stay unwhitened), as veRL does for GAE.
        advantages = masked_whiten(advantages, mask.bool())
    batch.advantages = advantages.float()
    batch.returns = returns.float()
    metrics["advantage_abs_mean"] = float(masked_mean(advantages.abs(), mask.bool()))
    return metrics
