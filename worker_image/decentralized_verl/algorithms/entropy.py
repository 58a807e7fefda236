"""Entropy of the policy's next-token distribution, from logits (a bonus or a health metric)."""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, masked_mean, zero_masked
from decentralized_verl.algorithms.policy_loss import aggregate

__all__ = ["entropy_from_logits", "masked_entropy"]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H = logsumexp(z) - sum(softmax(z) * z) per position over the last (vocab) axis.

    This form needs no log of a probability, so it stays finite for very peaked distributions.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def masked_entropy(logits: Tensor, mask: Tensor, aggregation: str | None = None) -> tuple[Tensor, Tensor]:
    """(per-token entropy [B, T] with exact 0 at masked positions, scalar mean over valid tokens).

    Masked rows of `logits` are replaced by zeros before the softmax, so junk there (even inf-free
    huge values) cannot produce NaN in the forward pass or the gradient. `aggregation` picks a
    registered loss aggregation for the scalar; default is the plain token mean.
    """
    if logits.dim() != 3 or logits.shape[:2] != mask.shape:
        raise ValueError(
            f"logits: expected [B, T, V] matching mask {tuple(mask.shape)}, got {tuple(logits.shape)}"
        )
    mask = as_bool_mask(mask)
    safe = torch.where(mask[..., None], logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
    per_token = zero_masked(entropy_from_logits(safe), mask)
    if aggregation is None:
        return per_token, masked_mean(per_token, mask)
    return per_token, aggregate(per_token, mask, aggregation)
