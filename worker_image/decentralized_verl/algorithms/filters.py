"""Batch filters and reward shaping from DAPO and best-of-n selection: which samples train, and how much.

Each returns a [B] keep-mask (bool) or a [B] reward adjustment; none looks at token contents.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_groups, group_sum

__all__ = [
    "dynamic_sampling_keep_mask",
    "mask_truncated",
    "overlong_penalty",
    "top_k_indices",
    "top_k_keep_mask",
]


def _check_per_sample(name: str, x: Tensor, batch: int) -> None:
    if x.shape != (batch,):
        raise ValueError(f"{name}: expected shape [{batch}], got {tuple(x.shape)}")


def dynamic_sampling_keep_mask(
    successes: Tensor,
    group_index: Tensor,
    *,
    min_rate: float = 0.0,
    max_rate: float = 1.0,
    inclusive: bool = False,
) -> Tensor:
    """DAPO dynamic sampling: keep whole groups whose success rate lies in the range.

    `successes` is [B] bool or float in [0, 1] (partial credit counts as a fraction). A group
    whose answers all succeed or all fail has zero group-relative advantage and only dilutes the
    batch, so the default (open interval (0, 1)) drops exactly those; `inclusive=True` keeps
    rates equal to the bounds. Groups of one sample are allowed here (they are judged alone).
    """
    batch = group_index.shape[0]
    _check_per_sample("successes", successes, batch)
    if not 0.0 <= min_rate <= max_rate <= 1.0:
        raise ValueError(f"need 0 <= min_rate <= max_rate <= 1 (got {min_rate}, {max_rate})")
    dense, sizes = check_groups(group_index, batch, min_size=1)
    values = successes.to(torch.float64)
    if not bool(((values >= 0) & (values <= 1)).all()):
        raise ValueError("successes: values must lie in [0, 1]")
    rate = (group_sum(values, dense, sizes.numel()) / sizes.to(torch.float64))[dense]
    if inclusive:
        return (rate >= min_rate) & (rate <= max_rate)
    return (rate > min_rate) & (rate < max_rate)


def overlong_penalty(lengths: Tensor, *, max_length: int, cache_length: int) -> Tensor:
    """DAPO soft overlong punishment (eq. 13), a [B] float to add to each sample's reward.

    0 for L <= L_max - L_cache; (L_max - L_cache - L) / L_cache inside the cache window (a ramp
    from 0 down to -1 at L = L_max); -1 beyond L_max. The ramp tells the policy that length is
    costly before answers get cut off, instead of a cliff at the limit.
    """
    if lengths.dim() != 1 or lengths.is_floating_point():
        raise ValueError(f"lengths: expected [B] integers, got {lengths.dtype} {tuple(lengths.shape)}")
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length (got {cache_length}, {max_length})")
    start = max_length - cache_length
    ramp = (start - lengths.to(torch.float64)) / cache_length
    penalty = torch.where(lengths <= start, 0.0, ramp)
    return torch.where(lengths > max_length, -1.0, penalty).to(torch.float32)


def mask_truncated(mask: Tensor, truncated: Tensor) -> Tensor:
    """The response mask with every row whose generation hit the length limit zeroed.

    A cut-off answer is neither right nor wrong, so DAPO keeps it out of the loss.
    Returns the mask in its own dtype.
    """
    bool_mask = as_bool_mask(mask)
    _check_per_sample("truncated", truncated, mask.shape[0])
    keep = bool_mask & ~as_bool_mask(truncated, name="truncated")[:, None]
    return keep.to(mask.dtype)


def top_k_keep_mask(scores: Tensor, group_index: Tensor, k: int) -> Tensor:
    """Top-k: within each prompt group keep the k best-scoring candidates.

    When many completions are sampled per prompt, training on the best few is cheaper and
    sharper. Ties go to the earlier sample (a stable order); a group with <= k samples is kept whole.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    _check_per_sample("scores", scores, group_index.shape[0])
    dense, _ = check_groups(group_index, scores.shape[0], min_size=1)
    # Sort by score descending (stable, so earlier samples win ties), then stably by group so
    # each group's members appear together in score order; rank = position inside its group.
    by_score = torch.sort(scores, descending=True, stable=True).indices
    order = by_score[torch.sort(dense[by_score], stable=True).indices]
    sorted_groups = dense[order]
    positions = torch.arange(order.numel(), device=scores.device)
    boundaries = torch.ones_like(sorted_groups, dtype=torch.bool)
    boundaries[1:] = sorted_groups[1:] != sorted_groups[:-1]
    first = torch.cummax(torch.where(boundaries, positions, 0), dim=0).values
    rank = torch.empty_like(positions)
    rank[order] = positions - first
    return rank < k


def top_k_indices(scores: Tensor, group_index: Tensor, k: int) -> Tensor:
    """Indices (ascending) of the samples `top_k_keep_mask` keeps, for `batch[indices]`."""
    return torch.nonzero(top_k_keep_mask(scores, group_index, k)).squeeze(1)
