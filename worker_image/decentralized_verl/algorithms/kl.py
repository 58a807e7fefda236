"""KL(policy || reference) estimators per sampled token, and the two ways to use them.

With x = ref_logprob - logprob on a token sampled from the policy (Schulman's "Approximating KL"):
k1 = -x (unbiased, high variance, can be negative), k2 = x^2 / 2 (biased, low variance),
k3 = exp(x) - x - 1 (unbiased, low variance, always >= 0; GRPO's choice). k3 is clamped as veRL clamps its
`low_var_kl`: x to [-20, 20] before the exp and the result to [-10, 10], because exp(x) explodes for a
token the policy has made far less likely than the reference does, and one such token would otherwise
own the whole loss (and its gradient).

KL in the reward (PPO/REINFORCE++ style) subtracts kl_coef * kl from the token rewards before the
advantages are computed; KL in the loss (GRPO style) adds kl_coef * mean kl to the policy loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_same_shape, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import aggregate
from decentralized_verl.algorithms.registry import KL_ESTIMATORS, kl_estimator, lookup

__all__ = ["KL_ESTIMATORS", "k1", "k2", "k3", "kl_in_loss", "kl_in_reward", "token_kl"]


@kl_estimator("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """log pi - log pi_ref."""
    return logprobs - ref_logprobs


@kl_estimator("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """(log pi - log pi_ref)^2 / 2."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


K3_LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


@kl_estimator("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """exp(x) - x - 1 with x = log pi_ref - log pi clamped to +-20, the result clamped to [-10, 10]
    (expm1 keeps it accurate near 0); beyond the clamp a token adds a constant, not a gradient."""
    x = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.expm1(x) - x).clamp(-K3_BOUND, K3_BOUND)


def token_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL [B, T] by the named estimator, exactly 0 at masked positions."""
    check_same_shape(mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    mask = as_bool_mask(mask)
    fn = lookup(KL_ESTIMATORS, "KL estimator", estimator)
    return zero_masked(fn(zero_masked(logprobs, mask), zero_masked(ref_logprobs, mask)), mask)


def kl_in_reward(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """(token_rewards - kl_coef * kl, zero at masked positions; metrics {"kl": mean kl}).

    The KL is a constant here (no gradient flows through a reward), so it is computed detached.
    """
    check_same_shape(mask, token_rewards=token_rewards)
    with torch.no_grad():
        kl = token_kl(logprobs.detach(), ref_logprobs.detach(), mask, estimator)
    bool_mask = as_bool_mask(mask)
    shaped = zero_masked(token_rewards, bool_mask) - kl_coef * kl.to(token_rewards.dtype)
    rewards = zero_masked(shaped, bool_mask)
    return rewards, {"kl": masked_mean(kl, bool_mask).item()}


def kl_in_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kl_coef: float,
    estimator: str = "k3",
    aggregation: str = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """(kl_coef * aggregated kl, a scalar to add to the policy loss; metrics {"kl": mean kl}).

    Gradients flow through `logprobs`; the reference is treated as a constant.
    """
    kl = token_kl(logprobs, ref_logprobs.detach(), mask, estimator)
    term = kl_coef * aggregate(kl, mask, aggregation)
    return term, {"kl": masked_mean(kl.detach(), as_bool_mask(mask)).item()}
