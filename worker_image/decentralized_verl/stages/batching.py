"""Token layout for the stages: render a prompt, join it with a completion, mask, pad, shuffle."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def render_prompt(tokenizer: Any, prompt: str, fmt: str) -> str:
    """`plain`: the prompt text itself; `chat`: one user turn plus the assistant header."""
    if fmt == "plain":
        return prompt
    if fmt == "chat":
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    raise ValueError(f"format must be 'plain' or 'chat' (got {fmt!r})")


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_completion(
    tokenizer: Any, prompt: str, completion: str, fmt: str, max_length: int, *, add_eos: bool = True
) -> tuple[list[int], list[int]]:
    """(ids, loss mask): prompt and completion tokenised separately, so the boundary is exact.

    Too long: the completion keeps at least half the budget, the prompt keeps its end (nearest the answer).
    """
    prompt_ids = _ids(tokenizer, render_prompt(tokenizer, prompt, fmt))
    completion_ids = _ids(tokenizer, completion) + ([tokenizer.eos_token_id] if add_eos else [])
    if len(prompt_ids) + len(completion_ids) > max_length:
        completion_ids = completion_ids[: max(max_length - len(prompt_ids), max_length // 2)]
        keep = max_length - len(completion_ids)
        prompt_ids = prompt_ids[len(prompt_ids) - keep :] if keep > 0 else []
    return prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids)


def encode_scored(tokenizer: Any, prompt: str, response: str, fmt: str, max_length: int) -> list[int]:
    """What a reward model reads: prompt then response, no EOS (pad may equal EOS); keeps the end."""
    ids = _ids(tokenizer, render_prompt(tokenizer, prompt, fmt)) + _ids(tokenizer, response)
    return ids[-max_length:]


def pad(rows: list[list[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T], attention mask [B, T]) padded to the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def pad_values(rows: list[list[int]], side: str = "right") -> torch.Tensor:
    """Pad per-token 0/1 values (a loss mask) the same way `pad` pads ids."""
    return pad(rows, 0, side)[0]


def batch_indices(
    n: int, batch_size: int, epochs: int, seed: int, max_steps: int | None
) -> Iterator[tuple[int, list[int]]]:
    """(epoch, indices) per step: a seeded shuffle per epoch, the last short batch kept."""
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        for start in range(0, n, batch_size):
            if max_steps is not None and step >= max_steps:
                return
            yield epoch, order[start : start + batch_size]
            step += 1


def planned_steps(n: int, batch_size: int, epochs: int, max_steps: int | None) -> int:
    total = epochs * -(-n // batch_size)
    return total if max_steps is None else min(total, max_steps)
