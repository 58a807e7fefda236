"""How a step's samples are cut into mini-batches (one optimizer step each) and micro-batches (one forward
each), and how much each micro-batch's loss weighs.

Whole prompt groups stay together, so a micro-batch runs each prompt once (`core.forward`). Micro-batches
are cut either by a row count (`training.microbatchSize` prompts) or packed by a token budget
(`training.microbatchTokens`: the positions the forward computes, shared prompts once, padding included,
so rows of like length go together). Either way the mini-batch's loss is the same: each micro-batch's
loss, an average over its own tokens or samples, is weighted by its share of the mini-batch's tokens or
samples (`loss_weights`), so the sum equals the loss of the whole mini-batch in one forward.
Pure: tensors in, index tensors and floats out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Group:
    """The rows of one prompt within a batch, with the sizes packing needs."""

    rows: tuple[int, ...]
    prompt_length: int
    response_lengths: tuple[int, ...]


def groups_of(
    group_index: torch.Tensor, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor
) -> list[Group]:
    """Rows grouped by prompt (`group_index`), in order of first appearance."""
    by_group: dict[int, list[int]] = {}
    for row, g in enumerate(group_index.tolist()):
        by_group.setdefault(int(g), []).append(row)
    return [
        Group(
            rows=tuple(rows),
            prompt_length=int(prompt_lengths[rows[0]]),
            response_lengths=tuple(int(response_lengths[r]) for r in rows),
        )
        for rows in by_group.values()
    ]


def cost(groups: list[Group]) -> int:
    """Token positions a forward over these groups computes: prompts once, rows padded to the longest."""
    if not groups:
        return 0
    rows = sum(len(g.rows) for g in groups)
    longest_prompt = max(g.prompt_length for g in groups)
    longest_response = max(max(g.response_lengths, default=1) for g in groups)
    if rows == len(groups):  # no prompt repeats: one pass over prompt + response
        return rows * (longest_prompt + longest_response)
    return len(groups) * longest_prompt + rows * max(longest_response - 1, 0)


def minibatches(
    groups: list[Group], groups_per_minibatch: int, generator: torch.Generator
) -> list[list[Group]]:
    """Groups shuffled (one permutation per epoch, from the trainer's seeded generator) and cut in order."""
    order = torch.randperm(len(groups), generator=generator).tolist()
    size = max(1, groups_per_minibatch)
    return [[groups[i] for i in order[k : k + size]] for k in range(0, len(order), size)]


def by_rows(groups: list[Group], groups_per_microbatch: int) -> list[list[Group]]:
    size = max(1, groups_per_microbatch)
    return [groups[k : k + size] for k in range(0, len(groups), size)]


def by_tokens(groups: list[Group], budget: int) -> list[list[Group]]:
    """First-fit decreasing by response length, each micro-batch's `cost` within `budget`. A group over
    the budget alone is split into row chunks that fit (its prompt then runs once per chunk)."""
    pieces: list[Group] = []
    for g in groups:
        pieces.extend(_split(g, budget) if cost([g]) > budget else [g])
    pieces.sort(key=lambda g: (max(g.response_lengths, default=0), g.prompt_length), reverse=True)
    bins: list[list[Group]] = []
    for piece in pieces:
        for b in bins:
            if cost([*b, piece]) <= budget:
                b.append(piece)
                break
        else:
            bins.append([piece])
    return bins


def _split(group: Group, budget: int) -> list[Group]:
    chunks: list[Group] = []
    rows: list[int] = []
    lengths: list[int] = []
    for row, length in zip(group.rows, group.response_lengths, strict=True):
        trial = Group(tuple([*rows, row]), group.prompt_length, tuple([*lengths, length]))
        if rows and cost([trial]) > budget:
            chunks.append(Group(tuple(rows), group.prompt_length, tuple(lengths)))
            rows, lengths = [], []
        rows.append(row)
        lengths.append(length)
    chunks.append(Group(tuple(rows), group.prompt_length, tuple(lengths)))
    return chunks


def rows_of(groups: list[Group]) -> list[int]:
    return [row for g in groups for row in g.rows]


def loss_weights(response_mask: torch.Tensor, parts: list[list[int]], aggregation: str) -> list[float]:
    """Each micro-batch's share of the mini-batch's loss normaliser: valid tokens for `token_mean`, samples
    with any valid token for the sequence means. The weights sum to 1 (equal shares when nothing counts)."""
    valid = response_mask.bool()
    if aggregation == "token_mean":
        counts = [float(valid[rows].sum()) for rows in parts]
    else:
        counts = [float(valid[rows].any(dim=1).sum()) for rows in parts]
    total = sum(counts)
    if total == 0:
        return [1.0 / len(parts)] * len(parts)
    return [c / total for c in counts]
