"""Per-token log-probabilities of the tokens a sequence actually contains (learner, reference, critic)."""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses; without them a left-padded row sees shifted
    rotary positions and its log-probs differ from the same row unpadded."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """[B, T] log p(input_ids[t] | < t) from logits [B, T, V]; column 0 has no predecessor and is 0."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    scaled = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(scaled, -1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)


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
