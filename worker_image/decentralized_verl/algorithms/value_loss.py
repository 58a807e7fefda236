"""Critic loss with PPO's value clipping."""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import aggregate

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float | None = 0.2,
    aggregation: str = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c); (loss, metrics).

    Clipping keeps the critic near the values the advantages were computed with, as the policy's
    ratio clip does for the actor. `clip_range=None` gives the plain squared error.
    Metrics: `vf_clip_frac` (the clipped branch is the larger) and `vf_mse` (unclipped error).
    """
    check_same_shape(mask, values=values, old_values=old_values, returns=returns)
    mask = as_bool_mask(mask)
    if clip_range is not None and clip_range < 0:
        raise ValueError(f"clip_range must be >= 0 or None (got {clip_range})")
    v = zero_masked(values, mask)
    old = zero_masked(old_values, mask).to(v.dtype)
    target = zero_masked(returns, mask).to(v.dtype)
    plain = (v - target) ** 2
    if clip_range is None:
        per_token = 0.5 * plain
        clipped_more = torch.zeros_like(mask)
    else:
        v_clipped = old + torch.clamp(v - old, -clip_range, clip_range)
        clipped = (v_clipped - target) ** 2
        per_token = 0.5 * torch.maximum(plain, clipped)
        clipped_more = clipped > plain
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        metrics = {
            "vf_clip_frac": masked_mean(clipped_more.to(v.dtype), mask).item(),
            "vf_mse": masked_mean(plain, mask).item(),
        }
    return loss, metrics
