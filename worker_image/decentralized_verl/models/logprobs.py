"""Per-token log-probabilities of every token of whole sequences, for the SFT and reward-model stages.

The RL roles score only response tokens (`core/forward.py`); both take the log-probability of a token
from its logits through the one kernel, `core/token_logprobs.py`, and positions through
`core/samples.position_ids_from_mask`, so a stage and the learner agree on a token's log-prob.
"""

from __future__ import annotations

import torch

from decentralized_verl.core.samples import position_ids_from_mask
from decentralized_verl.core.token_logprobs import token_logprobs


def token_logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """[B, T] log p(input_ids[t] | < t) from logits [B, T, V]; column 0 has no predecessor and is 0."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    rows, width, vocab = logits.shape
    picked = token_logprobs(logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1), temperature)
    picked = picked.view(rows, width - 1)
    return torch.cat([picked.new_zeros(rows, 1), picked], dim=1)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """[B, T]: log-prob of token t given tokens before it, zero where `response_mask` is 0.

    Aligned with `input_ids` (entry t scores token t), so the caller's response mask applies directly.
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != response_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same shape"
        )
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    logprobs = token_logprobs_from_logits(out.logits, input_ids, temperature)
    return logprobs * response_mask.to(logprobs.dtype)
