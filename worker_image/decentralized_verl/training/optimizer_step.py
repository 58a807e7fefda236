"""One optimizer step, the same wherever weights are trained: the policy learner, the critic (plain and
sharded), the SFT and reward-model stages, and the volunteer learner.

Gradients have been accumulated by the caller (its own micro-batches, loss weights and collectives); the
step then clips them to a global norm, reports that norm, applies the optimizer and advances the learning
rate schedule. Callers differ only in what they ask for: a learner replica whose gradient is not finite
must skip the update on every replica alike (the norm is global, so all of them see it), a worker that
keeps no gradients between calls drops them after the step, and the volunteer learner clips nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: `grad_norm` is the gradients' global norm before clipping (None when the caller
    asked for no clipping); `skipped` says the weights were left as they were."""

    grad_norm: float | None
    skipped: bool = False


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: Iterable[torch.Tensor],
    *,
    max_grad_norm: float | None,
    scheduler: Any | None = None,
    skip_nonfinite: bool = False,
    clear_grads: bool = False,
) -> StepOutcome:
    """Clip `params`' gradients to `max_grad_norm` (None: no clipping), step `optimizer`, then `scheduler`.

    With `skip_nonfinite` a gradient whose norm is inf or NaN is dropped instead (gradients cleared, no
    step, no schedule advance): one such step would poison the weights for good. `clear_grads` drops the
    gradients after the step, for callers that accumulate afresh on every call.
    """
    norm = None
    if max_grad_norm is not None:
        norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(list(params), max_grad_norm))
        if skip_nonfinite and not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return StepOutcome(norm, skipped=True)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    if clear_grads:
        optimizer.zero_grad(set_to_none=True)
    return StepOutcome(norm)


def grad_norm_value(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s total as a float; over FSDP's DTensor gradients it is a DTensor, made whole."""
    full_tensor = getattr(norm, "full_tensor", None)
    return float(full_tensor() if full_tensor is not None else norm)
