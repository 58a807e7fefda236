"""GSPO (Group Sequence Policy Optimization): PPO's clipped surrogate on a sequence-level importance ratio.

A token-level ratio pi/pi_old weighs each token of an answer by its own noisy ratio, although the reward
belongs to the whole answer; GSPO instead gives every token of sample i the same, length-normalised
ratio s_i = (pi(y_i) / pi_old(y_i)) ^ (1 / |y_i|) = exp(mean_t log(pi_t / pi_old_t)) and clips it, so
a whole answer is kept or clipped together. Its paper's objective is a mean over sequences of
min(s_i A_i, clip(s_i) A_i).

The token form ("GSPO-token") lets advantages vary per token: s_i,t = sg[s_i] * pi_t / sg[pi_t] has the
value s_i and the gradient s_i * grad log pi_t, so with the per-sequence mean of tokens
(`seq_mean_token_mean`) and one advantage per sequence it is exactly the sequence objective.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import (
    MAX_LOG_RATIO,
    aggregate,
    apply_weights,
    clamped_log_ratio,
    clip_margins,
    ratio_metrics,
)
from decentralized_verl.algorithms.registry import policy_loss

__all__ = ["GSPO_AGGREGATION", "gspo_policy_loss", "sequence_log_ratio"]

GSPO_AGGREGATION = "seq_mean_token_mean"
"""The one aggregation that is GSPO's objective (the others weigh sequences by their length)."""


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """[B] mean over each sample's valid tokens of log(pi / pi_old); 0 for a sample with none."""
    mask = as_bool_mask(mask)
    return masked_mean(clamped_log_ratio(logprobs, old_logprobs, mask), mask, dim=1)


@policy_loss("gspo")
def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float | None = 4e-4,
    aggregation: str = GSPO_AGGREGATION,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token loss over a padded batch; returns (scalar loss, metrics).

    Per token: loss = max(-A * s, -A * clip(s, 1 - clip_low, 1 + clip_high)) with s = s_i,t above.
    `clip_high` None means `clip_low`. The defaults are the paper's (a sequence ratio moves little, so
    its range is far narrower than PPO's 0.2). `weights` ([B, T], detached) multiply each token's loss.

    Metrics: `clip_frac` (tokens whose clipped branch is active), `seq_ratio_mean`/`seq_ratio_max`
    (over samples with a valid token), and the token-level `approx_kl`, `ratio_mean`, `ratio_max`.
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    mask = as_bool_mask(mask)
    clip_low, clip_high = clip_margins(clip_low, clip_high)
    if aggregation != GSPO_AGGREGATION:
        raise ValueError(
            f"gspo: aggregation must be {GSPO_AGGREGATION!r}, the mean over sequences that is GSPO's "
            f"objective (got {aggregation!r}, which weighs sequences by their length)"
        )

    seq_log_ratio = sequence_log_ratio(logprobs.detach(), old_logprobs, mask)
    current = zero_masked(logprobs, mask)
    log_s = seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)[:, None] + (current - current.detach())
    s = torch.exp(log_s)
    adv = zero_masked(advantages, mask).to(s.dtype)

    unclipped = -adv * s
    clipped = -adv * torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high)
    loss = apply_weights(torch.maximum(unclipped, clipped), weights, mask)
    total = aggregate(loss, mask, aggregation)
    with torch.no_grad():
        rows = mask.any(dim=1)
        seq_ratio = torch.exp(seq_log_ratio)
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).to(s.dtype), mask).item(),
            "seq_ratio_mean": masked_mean(seq_ratio, rows).item(),
            "seq_ratio_max": seq_ratio[rows].max().item() if bool(rows.any()) else 0.0,
            **ratio_metrics(clamped_log_ratio(logprobs, old_logprobs, mask), mask, mask),
        }
    return total, metrics
