"""PPO's clipped surrogate (with DAPO clip-higher and dual-clip), the ways to aggregate a per-token loss,
and what every registered policy loss shares (the clamped log-ratio, per-token weights, ratio metrics).
The other losses live beside this module: `gspo.py` (sequence-level ratio), `weighted_pg.py` (CISPO and
the plain policy gradient).

Aggregations decide how much each token weighs. `token_mean` (DAPO) weighs every token alike, so
long answers are not diluted; `seq_mean_token_mean` (original GRPO) weighs every sample alike;
`seq_mean_token_sum` (Dr.GRPO-like) sums tokens per sample, then averages over samples.
A sample takes part in a sequence mean only if it has at least one valid (and unskipped) token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.registry import (
    POLICY_LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    lookup,
    loss_aggregation,
    policy_loss,
)

__all__ = [
    "MAX_LOG_RATIO",
    "POLICY_LOSSES",
    "POLICY_LOSS_AGGREGATIONS",
    "aggregate",
    "apply_weights",
    "clamped_log_ratio",
    "ppo_policy_loss",
    "ratio_metrics",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "token_mean",
]

MAX_LOG_RATIO = 20.0
"""log-ratios are clamped to +-20 before exp, so one wild token cannot overflow to inf."""


def clamped_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log(pi / pi_old) per token, clamped to +-MAX_LOG_RATIO, exactly 0 at masked positions."""
    return zero_masked(logprobs - old_logprobs, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def apply_weights(loss: Tensor, weights: Tensor | None, mask: Tensor) -> Tensor:
    """`loss * weights` per token, the weights detached (they scale a token's gradient, they are no path
    for one); None leaves the loss as it is. Rollout-correction importance weights arrive this way."""
    if weights is None:
        return loss
    check_same_shape(mask, weights=weights)
    return loss * zero_masked(weights.detach(), mask).to(loss.dtype)


def ratio_metrics(log_ratio: Tensor, keep: Tensor, mask: Tensor) -> dict[str, float]:
    """`approx_kl` (mean old - new log-prob), `ratio_mean` over kept tokens, `ratio_max` over all valid."""
    ratio = torch.exp(log_ratio.detach())
    return {
        "approx_kl": masked_mean(-log_ratio.detach(), keep).item(),
        "ratio_mean": masked_mean(ratio, keep).item(),
        "ratio_max": ratio[mask].max().item() if bool(mask.any()) else 0.0,
    }


@loss_aggregation("token_mean")
def token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    """Mean over every valid token of the batch."""
    return masked_mean(loss, mask)


@loss_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor) -> Tensor:
    """Sum over each sample's valid tokens, then mean over samples that have any."""
    per_sample = zero_masked(loss, mask).sum(dim=1)
    return masked_mean(per_sample, mask.any(dim=1))


@loss_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    """Mean over each sample's valid tokens, then mean over samples that have any."""
    per_sample = masked_mean(loss, mask, dim=1)
    return masked_mean(per_sample, mask.any(dim=1))


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token_mean") -> Tensor:
    """Reduce a per-token loss with the named aggregation (`ValueError` lists the known names)."""
    fn = lookup(POLICY_LOSS_AGGREGATIONS, "loss aggregation", mode)
    return fn(loss, as_bool_mask(mask, like=loss))


def clip_margins(clip_low: float, clip_high: float | None) -> tuple[float, float]:
    """A ratio clip's (low, high) margins around 1, `clip_high` None meaning `clip_low`; ValueError when
    either is negative."""
    if clip_high is None:
        clip_high = clip_low
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low/clip_high must be >= 0 (got {clip_low}, {clip_high})")
    return clip_low, clip_high


@policy_loss("ppo_clip")
def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    aggregation: str = "token_mean",
    skip_threshold: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss over a padded batch; returns (scalar loss, metrics).

    Per token, with r = exp(logprobs - old_logprobs) and advantage A:
        loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
    `clip_high` defaults to `clip_low`; a larger one is DAPO's clip-higher (room for
    low-probability tokens to grow). `dual_clip` = c > 1 also bounds the loss for A < 0 at -c * A,
    so a huge ratio on a bad token cannot blow up the update.

    `skip_threshold`: a sample whose *mean* ratio over its valid tokens exceeds the threshold is
    left out of the loss entirely (a guard against samples the policy has drifted far from); mean
    rather than max so one noisy token does not discard a whole answer. `weights` ([B, T], detached)
    multiply each token's loss after the clip (rollout-correction importance weights).

    Metrics (python floats, over valid unskipped tokens unless said): `clip_frac` (the clipped
    branch is active), `dual_clip_frac`, `approx_kl` (mean of old - new log-prob), `ratio_mean`,
    `ratio_max` (over all valid tokens), `skipped_frac` (fraction of samples skipped).
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    mask = as_bool_mask(mask)
    clip_low, clip_high = clip_margins(clip_low, clip_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    if skip_threshold is not None and skip_threshold <= 0:
        raise ValueError(f"skip_threshold must be > 0 (got {skip_threshold})")

    log_ratio = clamped_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    adv = zero_masked(advantages, mask).to(ratio.dtype)

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)

    keep = mask
    skipped = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    if skip_threshold is not None:
        sample_ratio = masked_mean(ratio.detach(), mask, dim=1)
        skipped = mask.any(dim=1) & (sample_ratio > skip_threshold)
        keep = mask & ~skipped[:, None]

    loss = apply_weights(loss, weights, mask)
    total = lookup(POLICY_LOSS_AGGREGATIONS, "loss aggregation", aggregation)(loss, keep)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).to(ratio.dtype), keep).item(),
            "dual_clip_frac": masked_mean(dual_active.to(ratio.dtype), keep).item(),
            **ratio_metrics(log_ratio, keep, mask),
            "skipped_frac": skipped.to(ratio.dtype).mean().item() if mask.shape[0] else 0.0,
        }
    return total, metrics
