"""LoRA through `peft`: only the adapters train and only they need to travel between workers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict

from decentralized_verl.errors import ModelError


def is_lora(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


def apply_lora(
    model: torch.nn.Module,
    lora: Any,
    *,
    field: str = "spec.model.lora",
    modules_to_save: list[str] | None = None,
) -> torch.nn.Module:
    """Wrap `model` with fresh LoRA adapters (B = 0, so outputs are unchanged until training).

    `modules_to_save` stay fully trainable (a reward model's new `score` head must learn too).
    """
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(lora.target_modules) - names)
    if missing:
        raise ModelError(f"{field}.targetModules: no module named {missing} in the model")
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=getattr(lora, "dropout", 0.0),
        bias="none",
        modules_to_save=modules_to_save,
    )
    return get_peft_model(model, config)


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a learner must ship after a step: the adapter weights for LoRA, the full weights otherwise."""
    if is_lora(model):
        return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}
    return {k: v.detach() for k, v in model.state_dict().items()}


@contextmanager
def base_only(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The adapter-free base of a LoRA model for the span of the block, in eval mode (no adapter dropout),
    then the model as it was: the reference a LoRA or QLoRA learner computes with its own weights, so a
    colocated reference costs no second copy of the base. The block must not overlap a training step on
    the same model (both run on the process's one compute thread)."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        model.train(was_training)
