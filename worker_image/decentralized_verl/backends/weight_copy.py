"""A weight refresh checked against the model before anything is copied: both generation backends take a
new policy version through `plan_weight_copy`, so a state dict with a wrong name, shape or dtype is refused
by name and the model (for vLLM, the engine) is never left half-updated. Tied tensors are copied once.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from decentralized_verl.errors import WireError


def plan_weight_copy(
    model: torch.nn.Module, state_dict: Mapping[str, Tensor], *, partial: bool = False
) -> list[tuple[Tensor, Tensor]]:
    """Validate ``state_dict`` against ``model`` and return (destination, source) pairs to copy.

    Raises ``WireError`` naming the first bad tensor (in the model's own order, then unexpected names).
    ``partial`` accepts a subset of the model's tensors (a LoRA job's adapter-only update); every tensor
    that is given must still match by name, shape and dtype.
    """
    own = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}  # one entry per distinct tensor, listing all its names
    for name, tensor in own.items():
        groups.setdefault(id(tensor), []).append(name)
    plan: list[tuple[Tensor, Tensor]] = []
    for names in groups.values():
        target = own[names[0]]
        given = [n for n in names if n in state_dict]
        if not given and partial:
            continue
        if not given:
            alias = f" (or its tied alias {', '.join(names[1:])})" if len(names) > 1 else ""
            raise WireError(f"weights[{names[0]!r}]", f"missing from the state dict{alias}")
        for name in given:
            source = state_dict[name]
            if not isinstance(source, Tensor):
                raise WireError(f"weights[{name!r}]", f"must be a tensor (got {type(source).__name__})")
            if tuple(source.shape) != tuple(target.shape):
                raise WireError(
                    f"weights[{name!r}]",
                    f"shape {tuple(source.shape)} does not match the model's {tuple(target.shape)}",
                )
            if source.dtype != target.dtype:
                raise WireError(
                    f"weights[{name!r}]", f"dtype {source.dtype} does not match the model's {target.dtype}"
                )
        plan.append((target.data if isinstance(target, torch.nn.Parameter) else target, state_dict[given[0]]))
    for name in state_dict:
        if name not in own:
            raise WireError(f"weights[{name!r}]", "is not a tensor of this model")
    return plan
