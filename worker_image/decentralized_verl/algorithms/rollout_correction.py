"""Rollout/learner mismatch correction: importance weights and rejection from the behaviour log-probs.

The rollout engine's log-probs (vLLM's kernels, another precision, a policy some versions old) are not
the learner's, so a batch sampled by the engine is slightly off-policy for the learner even at the same
weights. With the learner's own log-probs at the weights being updated, `pi_old`, and the engine's,
`pi_rollout`, the ratio rho_t = pi_old / pi_rollout per token measures the mismatch, and:

- truncated importance sampling (TIS) multiplies each token's loss by min(rho_t, cap) (`token`), or every
  token of a sample by min(prod_t rho_t, cap) (`sequence`, the sample's probability ratio): an unbiased
  correction, truncated so that one wild ratio cannot dominate the batch;
- rejection (MIS / IcePop) drops from the loss the tokens whose rho_t leaves [low, high] (`token`), or
  whole samples whose length-normalised ratio exp(mean_t log rho_t) does (`sequence`): tokens the two
  engines disagree on that much are noise, not signal.

How this composes with asynchronous staleness: the rollout may have sampled with weights some versions
older than the learner's. The PPO ratio (or GSPO's, CISPO's) is then taken against `pi_old`, the
learner's log-probs at the weights about to be updated, and rho = pi_old / pi_rollout carries both the
staleness and the engine mismatch at once (the decoupled objective of AReaL): the loss clips its trust
region around the current weights, and the correction weighs or rejects how far off-policy each token was
sampled. Without correction, the one ratio pi / pi_rollout carries both and only the loss's clip bounds it.
Pure functions; the weights are constants (no gradient flows through them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import MAX_LOG_RATIO, clamped_log_ratio

__all__ = ["Level", "RolloutCorrection", "correct_rollout"]

Level = Literal["off", "token", "sequence"]


@dataclass(frozen=True)
class RolloutCorrection:
    """Which corrections apply (`off` for none) and their thresholds."""

    importance_sampling: Level = "token"
    cap: float = 2.0
    """TIS truncation: a weight above `cap` is cut to `cap`."""
    rejection: Level = "off"
    reject_low: float = 0.5
    reject_high: float = 2.0

    def __post_init__(self) -> None:
        for name in ("importance_sampling", "rejection"):
            if getattr(self, name) not in ("off", "token", "sequence"):
                raise ValueError(f"{name}: expected off, token or sequence (got {getattr(self, name)!r})")
        if self.cap < 1:
            raise ValueError(f"cap must be >= 1 (got {self.cap})")
        if not 0 < self.reject_low <= 1 <= self.reject_high:
            raise ValueError(
                f"the rejection band [reject_low, reject_high] must hold 1 (a token both engines agree on) "
                f"with reject_low > 0 (got [{self.reject_low}, {self.reject_high}])"
            )


def correct_rollout(
    learner_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, config: RolloutCorrection
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """(weights [B, T], kept mask [B, T] bool, metrics) for a batch.

    `weights` are the TIS factors (1 where importance sampling is off, 0 at masked or rejected
    positions); `kept` is `mask` minus the rejected tokens (the loss's new mask).
    Metrics: `abs_log_ratio_mean`/`abs_log_ratio_max` (|log rho| over valid tokens), `kl` (the k3
    estimate of KL(rollout || learner) from the rollout's samples), `masked_frac` (valid tokens
    rejected), `rejected_frac` (samples left with no token), `truncated_frac` (kept tokens whose weight
    hit the cap) and `weight_mean` (over kept tokens).
    """
    check_same_shape(mask, learner_logprobs=learner_logprobs, rollout_logprobs=rollout_logprobs)
    mask = as_bool_mask(mask)
    log_rho = clamped_log_ratio(learner_logprobs.detach(), rollout_logprobs.detach(), mask)
    rho = torch.exp(log_rho)

    kept = mask
    if config.rejection == "token":
        kept = mask & (rho >= config.reject_low) & (rho <= config.reject_high)
    elif config.rejection == "sequence":
        seq_rho = torch.exp(masked_mean(log_rho, mask, dim=1))
        inside = (seq_rho >= config.reject_low) & (seq_rho <= config.reject_high)
        kept = mask & inside[:, None]

    if config.importance_sampling == "token":
        raw = rho
    elif config.importance_sampling == "sequence":
        seq_log = zero_masked(log_rho, mask).sum(dim=1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        raw = torch.exp(seq_log)[:, None].expand_as(rho)
    else:
        raw = torch.ones_like(rho)
    weights = zero_masked(torch.clamp(raw, max=config.cap), kept)

    rows = mask.any(dim=1)
    metrics = {
        "abs_log_ratio_mean": masked_mean(log_rho.abs(), mask).item(),
        "abs_log_ratio_max": log_rho.abs()[mask].max().item() if bool(mask.any()) else 0.0,
        "kl": masked_mean(torch.expm1(log_rho) - log_rho, mask).item(),
        "masked_frac": masked_mean((mask & ~kept).to(rho.dtype), mask).item(),
        "rejected_frac": masked_mean((rows & ~kept.any(dim=1)).to(rho.dtype), rows).item(),
        "truncated_frac": masked_mean((raw > config.cap).to(rho.dtype), kept).item(),
        "weight_mean": masked_mean(weights, kept).item(),
    }
    return weights, kept, metrics
