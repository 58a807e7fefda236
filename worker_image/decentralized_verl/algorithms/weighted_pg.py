"""Policy losses of the form -w * A * log pi, with w a stop-gradient weight per token.

- `vanilla_pg`: w = 1, the plain REINFORCE-style policy gradient (no ratio, no clipping). On-policy its
  gradient equals PPO's at ratio 1; off-policy it does not correct for the behaviour policy at all.
- `cispo` (MiniMax-M1): w = sg[clip(pi / pi_old, 1 - clip_low, 1 + clip_high)]. PPO zeroes the gradient
  of a token whose ratio left the clip range (often the rare "fork" tokens a reasoning answer turns on);
  CISPO keeps every token's gradient and bounds only how much its importance weight may scale it.

The loss *value* of this form is not a surrogate of the return (it is -w * A * log pi, far from 0), only
its gradient is meaningful; it is logged as `pg_loss` all the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import (
    aggregate,
    apply_weights,
    clamped_log_ratio,
    ratio_metrics,
)
from decentralized_verl.algorithms.registry import policy_loss

__all__ = ["cispo_policy_loss", "vanilla_pg_loss"]


def _weighted_log_prob_loss(
    logprobs: Tensor, stop_grad_weight: Tensor, advantages: Tensor, mask: Tensor
) -> Tensor:
    """-w * A * log pi per token, exactly 0 at masked positions; only log pi carries a gradient."""
    current = zero_masked(logprobs, mask)
    adv = zero_masked(advantages, mask).to(current.dtype)
    return zero_masked(-stop_grad_weight.detach().to(current.dtype) * adv * current, mask)


@policy_loss("vanilla_pg")
def vanilla_pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """-A * log pi per token, aggregated; `old_logprobs` only feed the metrics (`approx_kl`, `ratio_*`)."""
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    mask = as_bool_mask(mask)
    loss = _weighted_log_prob_loss(logprobs, torch.ones_like(logprobs), advantages, mask)
    total = aggregate(apply_weights(loss, weights, mask), mask, aggregation)
    with torch.no_grad():
        metrics = {
            "clip_frac": 0.0,
            **ratio_metrics(clamped_log_ratio(logprobs, old_logprobs, mask), mask, mask),
        }
    return total, metrics


@policy_loss("cispo")
def cispo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float = 0.2,
    aggregation: str = "token_mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO loss: -sg[clip(r, 1 - clip_low, 1 + clip_high)] * A * log pi per token, aggregated.

    `clip_low` None leaves the weight unbounded below (the paper's choice: a token the policy now likes
    less only counts less). `weights` ([B, T], detached) multiply each token's loss on top.
    Metrics: `clip_frac` (tokens whose weight was clipped), `weight_mean`, and the ratio metrics.
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    mask = as_bool_mask(mask)
    if clip_high < 0 or (clip_low is not None and not 0 <= clip_low <= 1):
        raise ValueError(f"clip_high must be >= 0 and clip_low in [0, 1] (got {clip_low}, {clip_high})")
    log_ratio = clamped_log_ratio(logprobs.detach(), old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    low = 0.0 if clip_low is None else 1.0 - clip_low
    weight = torch.clamp(ratio, low, 1.0 + clip_high)
    loss = _weighted_log_prob_loss(logprobs, weight, advantages, mask)
    total = aggregate(apply_weights(loss, weights, mask), mask, aggregation)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((weight != ratio).to(ratio.dtype), mask).item(),
            "weight_mean": masked_mean(weight, mask).item(),
            **ratio_metrics(log_ratio, mask, mask),
        }
    return total, metrics
