"""Masked reductions and input checks shared by every algorithm module.

Convention: a response mask is a [B, T] tensor of 0/1 (bool or float). Masked positions may hold
anything (padding, tool output, junk), so every function first replaces them with a neutral value
(`torch.where`, never multiplication: `inf * 0` is NaN) and writes exactly 0 there on output.
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor, like: Tensor | None = None, name: str = "mask") -> Tensor:
    """Check a 0/1 mask (and its shape against `like`) and return it as bool."""
    if like is not None and mask.shape != like.shape:
        raise ValueError(f"{name}: shape {tuple(mask.shape)} does not match {tuple(like.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_complex:
        raise ValueError(f"{name}: dtype {mask.dtype} is not a 0/1 mask")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name}: values must be 0 or 1")
    return mask != 0


def check_same_shape(mask: Tensor, **tensors: Tensor | None) -> None:
    """Every given tensor must have the mask's [B, T] shape; the message names the odd one."""
    if mask.dim() != 2:
        raise ValueError(f"mask: expected [B, T], got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != mask.shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match mask {tuple(mask.shape)}")


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """`x` where the mask is set, exactly 0 elsewhere (whatever junk `x` held there)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum over the masked-in positions only."""
    x = zero_masked(x, mask)
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over masked-in positions; 0 where nothing is masked in (an empty mean adds no signal)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    total = masked_sum(x, mask, dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_whiten(x: Tensor, mask: Tensor, epsilon: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + epsilon) over the masked-in tokens of the whole batch.

    The variance is unbiased (Bessel's correction, as veRL's `masked_whiten`); with fewer than
    two valid tokens it is taken as 0. Masked positions come back as exactly 0.
    """
    count = mask.sum().to(x.dtype)
    mean = masked_sum(x, mask) / count.clamp(min=1)
    centred = zero_masked(x - mean, mask)
    var = (centred**2).sum() / (count - 1).clamp(min=1)
    return zero_masked(centred * torch.rsqrt(var + epsilon), mask)


def check_groups(group_index: Tensor, batch: int, min_size: int = 2) -> tuple[Tensor, Tensor]:
    """Validate group ids and return (dense id per sample [B], size per dense group [G]).

    Ids may be any integers in any order (uneven, non-contiguous groups); each group needs at
    least `min_size` members, since a baseline from one sample's own score is no baseline.
    """
    if group_index.dim() != 1 or group_index.shape[0] != batch:
        raise ValueError(f"group_index: expected shape [{batch}], got {tuple(group_index.shape)}")
    if group_index.is_floating_point() or group_index.dtype == torch.bool:
        raise ValueError(f"group_index: expected integer ids, got {group_index.dtype}")
    ids, dense = torch.unique(group_index, return_inverse=True)
    sizes = torch.bincount(dense, minlength=ids.numel())
    small = ids[sizes < min_size]
    if small.numel():
        raise ValueError(
            f"group_index: groups {small.tolist()} have fewer than {min_size} samples "
            f"(sizes {sizes[sizes < min_size].tolist()})"
        )
    return dense, sizes


def group_sum(values: Tensor, dense: Tensor, groups: int) -> Tensor:
    """Per-group sum of a [B] tensor given dense group ids."""
    return torch.zeros(groups, dtype=values.dtype, device=values.device).index_add_(0, dense, values)
