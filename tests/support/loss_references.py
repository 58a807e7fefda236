"""What the loss tests share: random inputs with the masks real batches have (right padding, holes, an
empty row), and the slow per-token reference of each aggregation mode, built from 0-d tensors so that
autograd gives reference gradients too."""

from __future__ import annotations

import torch

SHAPES = [(3, 1), (5, 7), (8, 12)]
AGGREGATIONS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]


def holey_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """0/1 float mask with right padding, holes in the middle, the first row empty and the last valid."""
    mask = (torch.rand(batch, length, generator=gen) < 0.7).double()
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    mask[torch.arange(length)[None, :] >= lengths[:, None]] = 0.0
    mask[0] = 0.0
    mask[-1] = 1.0
    return mask


def rand(shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def valid(mask, b):
    return [t for t in range(mask.shape[1]) if mask[b, t] != 0]


def ref_aggregate(per_token, mask, mode):
    """per_token: dict (b, t) -> 0-d tensor over valid positions."""
    rows = [b for b in range(mask.shape[0]) if valid(mask, b)]
    if not rows:
        return torch.tensor(0.0, dtype=torch.float64)
    if mode == "token_mean":
        items = [per_token[b, t] for b in rows for t in valid(mask, b)]
        return sum(items) / len(items)
    if mode == "seq_mean_token_sum":
        return sum(sum(per_token[b, t] for t in valid(mask, b)) for b in rows) / len(rows)
    if mode == "seq_mean_token_mean":
        return sum(sum(per_token[b, t] for t in valid(mask, b)) / len(valid(mask, b)) for b in rows) / len(
            rows
        )
    raise AssertionError(mode)
