"""Was a volunteer's response *sampled*, or chosen? A replay of its seeded draws on the trusted side.

The coordinator gives every rollout request a seed, and each episode's own seed follows from it and the
episode's identity (`core.seeds.item_seed`); the hf backend draws each token by inverse-CDF from one
uniform of a CPU generator seeded with it (`backends.hf.sample_tokens`). So the trusted side, holding
the policy of the claimed version, can redo the draws: one forward pass over prompt + response gives
every position's distribution, the seed gives every uniform, and each claimed token must be the one
that uniform picks. A volunteer that submits responses it chose (best of several draws, its own seed,
edited text with honestly recomputed log-probs) passes the log-prob check but not this one.

A multi-turn episode is replayed the same way, turn by turn: each model turn was generated as a request of
its own, seeded by (episode, turn) (`core.seeds.turn_seed`), on the context of the prompt and every
token before it. So the same single forward pass over prompt + whole episode gives the distributions of
every model token, and the tokens of model turn t (the t-th run of the loss mask) must be the draws of
turn t's seed. The environment's tokens between turns are not drawn; the episode rebuild
(`environments.verify`) checks those.

Incremental decoding and one full forward pass differ by rounding, so a uniform that falls within `tol`
of the edge between two tokens' intervals accepts either (a chosen token almost never lands there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from decentralized_verl.backends.hf import row_seed, sampling_probs
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.seeds import item_seed, turn_seed
from decentralized_verl.environments.verify import model_spans

if TYPE_CHECKING:
    from torch import Tensor

DEFAULT_TOL = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}
"""Probability mass by which a uniform may miss the claimed token's interval: rounding differences
between decoding and a full forward (about 1e-5 in float32) stay far below it."""


def episode_seed(
    sampling: SamplingParams, prompt_id: str, sample_index: int, turn: int | None = None
) -> int | None:
    """The seed the volunteer's backend drew this episode's tokens with, or those of its model turn `turn`
    (a multi-turn episode's); None: the request had none."""
    if sampling.seed is None:
        return None
    if turn is None:
        return row_seed(item_seed(sampling.seed, prompt_id, sample_index), 0)
    return row_seed(turn_seed(sampling.seed, prompt_id, sample_index, turn), 0)


def checkable(sampling: SamplingParams) -> bool:
    """Draws can be replayed: the request was seeded and sampled (greedy needs no seed to check)."""
    return sampling.seed is not None and sampling.temperature > 0


def draw_problem(
    logits: Tensor, response_ids: Sequence[int], seed: int, sampling: SamplingParams, tol: float
) -> str | None:
    """None when every token of `response_ids` is what the seeded sampler draws from `logits` (one row
    of raw model logits per response token, the row predicting it); else the first token that is not,
    with the token the seed draws."""
    count = len(response_ids)
    if count == 0:
        return None
    if logits.shape[0] != count:
        return f"{logits.shape[0]} positions for {count} tokens"
    scaled = logits.float() / sampling.temperature
    rows = torch.log_softmax(scaled, dim=-1)
    top_k = torch.full((count,), sampling.top_k, dtype=torch.long)
    top_p = torch.full((count,), float(sampling.top_p))
    probs = sampling_probs(rows, top_k, top_p).double()
    cdf = probs.cumsum(dim=-1)
    generator = torch.Generator()
    generator.manual_seed(seed)
    target = torch.rand(count, generator=generator).double() * cdf[:, -1]
    tokens = torch.tensor(list(response_ids), dtype=torch.long)
    if bool(((tokens < 0) | (tokens >= cdf.shape[-1])).any()):
        return "a token id outside the vocabulary"
    upper = cdf.gather(-1, tokens[:, None]).flatten()
    lower = upper - probs.gather(-1, tokens[:, None]).flatten()
    inside = (target >= lower - tol) & (target <= upper + tol)
    if bool(inside.all()):
        return None
    where = int((~inside).nonzero()[0])
    drawn = int(
        torch.searchsorted(cdf[where], target[where : where + 1], right=True).clamp(max=cdf.shape[-1] - 1)
    )
    return (
        f"token {where} is {int(tokens[where])}, but the assigned seed draws {drawn} there "
        f"(u*mass {float(target[where]):.4f}, the claimed token covers [{float(lower[where]):.4f}, "
        f"{float(upper[where]):.4f}]): not sampled from the policy with its seed"
    )


def sample_problem(logits: Tensor, sample, sampling: SamplingParams, tol: float) -> str | None:
    """None when every model token of `sample` is its seed's draw (`logits`: one row per response token,
    the row predicting it); else which token of which model turn is not. A multi-turn episode (one with a
    loss mask) is replayed turn by turn, each with its own seed; its environment tokens are not draws."""
    prompt_id, index = sample.prompt.prompt_id, sample.sample_index
    if sample.loss_mask is None:
        seed = episode_seed(sampling, prompt_id, index)
        return None if seed is None else draw_problem(logits, sample.response_ids, seed, sampling, tol)
    if len(sample.loss_mask) != len(sample.response_ids):
        return f"{len(sample.loss_mask)} loss-mask entries for {len(sample.response_ids)} tokens"
    for turn, (start, end) in enumerate(model_spans(sample.loss_mask)):
        seed = episode_seed(sampling, prompt_id, index, turn)
        if seed is None:
            return None
        problem = draw_problem(logits[start:end], sample.response_ids[start:end], seed, sampling, tol)
        if problem is not None:
            return f"model turn {turn} (response tokens {start}..{end - 1}): {problem}"
    return None


def response_logits(model, samples: Sequence, pad_token_id: int | None, microbatch: int = 8) -> list[Tensor]:
    """Per sample, [len(response), vocab] logits predicting each response token: one forward pass over
    prompt + response per micro-batch, padded on the right (a causal model's real positions never see
    the padding after them)."""
    device = next(model.parameters()).device
    out: list[Tensor] = []
    for start in range(0, len(samples), microbatch):
        part = samples[start : start + microbatch]
        rows = [list(s.prompt.token_ids) + list(s.response_ids) for s in part]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id or 0, dtype=torch.long)  # masked: any id
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        for i, s in enumerate(part):
            first = len(s.prompt.token_ids) - 1
            out.append(logits[i, first : first + len(s.response_ids)].float().cpu())
    return out
