"""The PPO critic: the policy's transformer backbone with a one-output linear head per token.

The value of response token t, V(s_t), is read from the hidden state at the column whose logits predict
token t (prompt_length - 1 + t): the column `core.forward` reads log-probs from (with the same shared
prompt pass), so values, log-probs and advantages line up token for token in the learner's [B, R] layout.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from decentralized_verl.core.forward import response_values
from decentralized_verl.core.samples import TrainBatch
from decentralized_verl.models.loading import load_model_and_tokenizer


def backbone_of(causal_lm: nn.Module) -> nn.Module:
    """The decoder stack without the LM head (e.g. `LlamaForCausalLM.model`)."""
    if hasattr(causal_lm, "get_decoder"):
        decoder = causal_lm.get_decoder()
        if decoder is not None:
            return decoder
    base = getattr(causal_lm, "base_model", None)
    if base is not None and base is not causal_lm:
        return base
    raise TypeError(f"cannot find the backbone of {type(causal_lm).__name__}")


class ValueModel(nn.Module):
    """Backbone + value head. Build with `from_causal_lm` (deep copy: the policy is not shared)."""

    def __init__(self, backbone: nn.Module, hidden_size: int, *, init_std: float = 1e-2) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = getattr(backbone, "config", None)
        """The backbone's Hugging Face config: a sharded checkpoint of the critic records it."""
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(hidden_size, 1, dtype=dtype)
        with torch.no_grad():  # small values at first: early advantages are ~ the returns themselves
            self.value_head.weight.normal_(0.0, init_std)
            self.value_head.bias.zero_()
        self.value_head.to(next(backbone.parameters()).device)

    @classmethod
    def from_causal_lm(cls, causal_lm: nn.Module, *, init_std: float = 1e-2) -> ValueModel:
        backbone = copy.deepcopy(backbone_of(causal_lm))
        return cls(backbone, int(causal_lm.config.hidden_size), init_std=init_std)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[B, R] values, zero at response padding."""
        return response_values(self.backbone, self.value_head, batch)

    forward = values


def build_value_model(model_spec: Any, *, device: str | torch.device | None = None) -> tuple[ValueModel, Any]:
    """A critic from a spec.model-like section (the critic role's model, else the policy's) and its
    tokenizer. LoRA and 4-bit settings are ignored: the critic trains all its weights, in full precision."""
    if getattr(model_spec, "lora", None) is not None or getattr(model_spec, "quantization", None) is not None:
        model_spec = model_spec.model_copy(update={"lora": None, "quantization": None})
    lm, tokenizer = load_model_and_tokenizer(model_spec, device=device, field="spec.roles.critic.model")
    critic = ValueModel.from_causal_lm(lm)
    del lm
    return critic, tokenizer
