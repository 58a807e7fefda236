"""Advantage estimators, registered by the names the spec accepts.

One calling convention for all of them, so the trainer can call any estimator blindly::

    advantages, returns = ADVANTAGE_ESTIMATORS[name](inputs, **hparams)

`inputs` is an `advantage_inputs.AdvantageInputs`; `hparams` is one shared dict (`gamma`, `lam`,
`norm_by_std`, `epsilon`): each estimator takes the keys its signature names and ignores the others, and an
unknown key raises `TypeError` (see `registry.advantage_estimator`). Both outputs are [B, T] and
exactly 0 at masked positions; outcome estimators return the advantages as returns too.

Which reward an estimator reads ("token rewards win when present"):
- token-level estimators (`gae`, `reinforce_plus_plus`) use `token_rewards`, or else put each
  sample's `score` on its last valid token;
- outcome estimators (`grpo`, `rloo`, `reinforce_plus_plus_baseline`) use the masked sum of
  `token_rewards` per sample (so a KL-in-reward penalty counts), or else `scores`.
Masked tokens never contribute: returns and GAE skip over holes in the mask, carrying the next
*valid* token's value/advantage across them (as if the masked tokens were not in the sequence).

A group of one sample (a filter or an uneven split can leave one; `topK: 1` always does) has no peers to
compare with: the group estimators give it veRL's definition, baseline (mean) 0 and std 1, so its
advantage is its own score rather than an error mid-job.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.advantage_inputs import AdvantageInputs
from decentralized_verl.algorithms.masking import group_sum, masked_whiten, zero_masked
from decentralized_verl.algorithms.registry import ADVANTAGE_ESTIMATORS, advantage_estimator

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "gae",
    "grpo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
]


def _broadcast(per_sample: Tensor, mask: Tensor) -> Tensor:
    return zero_masked(per_sample[:, None].expand(mask.shape), mask)


def _group_mean(scores: Tensor, dense: Tensor, sizes: Tensor) -> Tensor:
    """[G] mean score per group; 0 for a group of one (veRL's baseline for a lone sample)."""
    sizes = sizes.to(scores.dtype)
    mean = group_sum(scores, dense, sizes.numel()) / sizes
    return torch.where(sizes > 1, mean, torch.zeros((), dtype=scores.dtype))


def _discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_next over valid tokens, where `next` is the next valid token."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        step = rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], step, running)
        returns[:, t] = torch.where(mask[:, t], step, 0.0)
    return returns


@advantage_estimator("gae")
def gae(inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (PPO with a critic); needs token rewards and values.

    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, with V_next = 0
    after the last valid token; returns = A + V (the critic's regression target).
    """
    mask = inputs.mask()
    if inputs.values is None:
        raise ValueError("gae: needs values (a critic)")
    rewards = inputs.rewards_per_token(mask)
    values = zero_masked(inputs.values, mask).to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(valid, adv, 0.0)
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv, next_adv)
    returns = zero_masked(advantages + values, mask)
    return advantages, returns


@advantage_estimator("grpo")
def grpo(
    inputs: AdvantageInputs, *, norm_by_std: bool = True, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Group-relative advantage: (score - group mean) / (group std + epsilon).

    The std is unbiased (n - 1), as in veRL. `norm_by_std=False` is Dr.GRPO: dividing by the std
    up-weights prompts that are nearly always solved or failed, a bias Dr.GRPO removes. A group of one
    takes mean 0 and std 1.
    """
    mask = inputs.mask()
    scores = inputs.sample_scores(mask)
    dense, sizes = inputs.groups()
    centred = scores - _group_mean(scores, dense, sizes)[dense]
    if norm_by_std:
        n = sizes.to(scores.dtype)
        variance = group_sum(centred**2, dense, sizes.numel()) / (n - 1).clamp(min=1)
        std = torch.where(sizes > 1, torch.sqrt(variance), torch.ones((), dtype=scores.dtype))
        centred = centred / (std[dense] + epsilon)
    return _broadcast(centred, mask), _broadcast(centred, mask)


@advantage_estimator("rloo")
def rloo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Leave-one-out baseline: each sample is compared with the mean of its group's others (a group of
    one has no others: baseline 0)."""
    mask = inputs.mask()
    scores = inputs.sample_scores(mask)
    dense, sizes = inputs.groups()
    n = sizes.to(scores.dtype)[dense]
    totals = group_sum(scores, dense, sizes.numel())
    others = torch.where(n > 1, (totals[dense] - scores) / (n - 1).clamp(min=1), torch.zeros_like(scores))
    advantages = _broadcast(scores - others, mask)
    return advantages, advantages.clone()


@advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus(
    inputs: AdvantageInputs, *, gamma: float = 1.0, epsilon: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted return per token, whitened over all valid tokens of the batch.

    No critic and no groups: the batch-wide whitening is the baseline.
    """
    mask = inputs.mask()
    returns = _discounted_returns(inputs.rewards_per_token(mask), mask, gamma)
    advantages = masked_whiten(returns, mask, epsilon)
    return advantages, returns


@advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, *, epsilon: float = 1e-8) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline: score - group mean (0 for a group of one), broadcast,
    batch-whitened."""
    mask = inputs.mask()
    scores = inputs.sample_scores(mask)
    dense, sizes = inputs.groups()
    centred = _broadcast(scores - _group_mean(scores, dense, sizes)[dense], mask)
    advantages = masked_whiten(centred, mask, epsilon)
    return advantages, advantages.clone()
