"""Checking an untrusted worker's episode on the trusted side: rebuild it from the model's own tokens.

A volunteer claims a response sequence, its loss mask and the turns' texts. The coordinator keeps only the
model's tokens (each run of mask-1 tokens is one turn), decodes them itself, and plays the episode again
with a fresh environment through the same `EpisodeRunner`: the sequence it gets must be the claimed one
token for token, and the claimed turns must be what the tokens decode to. So a worker cannot slip forged
observations into the context the model is trained in, nor claim turn texts (which the reward replays)
its tokens do not say. Log-probs are checked separately (`volunteers.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from decentralized_verl.backends.hf import find_stop
from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.episode import TurnOutput
from decentralized_verl.environments.rollout import EpisodeRunner, TurnRequest, record_seed


class _Diverged(Exception):
    """The rebuilt episode asked for something the claimed one does not have."""


def model_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The model's turns as [start, end) positions in the response: each maximal run of mask-1 tokens."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, keep in enumerate((*loss_mask, 0)):
        if keep and start is None:
            start = i
        elif not keep and start is not None:
            spans.append((start, i))
            start = None
    return spans


def model_runs(response_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[int, ...]]:
    """The model's turns as token runs: each maximal run of mask-1 tokens."""
    if len(response_ids) != len(loss_mask):
        raise ValueError(f"{len(loss_mask)} mask entries for {len(response_ids)} tokens")
    return [tuple(response_ids[a:b]) for a, b in model_spans(loss_mask)]


def turn_text(tokenizer: Any, tokens: Sequence[int], stop: Sequence[str]) -> str:
    """A turn's text as a generation backend reports it: decoded without special tokens, cut after the
    earliest stop string."""
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    end = find_stop(text, stop) if stop else None
    return text if end is None else text[:end]


def episode_problem(
    runner: EpisodeRunner, sample: Any, max_tokens_per_turn: int, stop: Sequence[str] = ()
) -> str | None:
    """Why the claimed episode is not the one its model tokens make, or None when it is."""
    if sample.loss_mask is None or len(sample.loss_mask) != len(sample.response_ids):
        return "no loss mask for its tokens"
    runs = model_runs(sample.response_ids, sample.loss_mask)
    texts = [turn_text(runner.tokenizer, run, stop) for run in runs]
    if tuple(texts) != tuple(sample.turns):
        wrong = _first_difference(texts, sample.turns)
        return f"turn {wrong}'s text is not what its tokens decode to"

    def generate(requests: Sequence[TurnRequest]):
        for r in requests:
            if r.turn >= len(runs):
                raise _Diverged(f"the episode goes on after the {len(runs)} turns claimed")
            if len(runs[r.turn]) > r.max_new_tokens:
                raise _Diverged(f"turn {r.turn} has {len(runs[r.turn])} tokens, {r.max_new_tokens} allowed")
            yield r.index, TurnOutput(runs[r.turn], (0.0,) * len(runs[r.turn]), "stop", texts[r.turn])

    prompt = sample.prompt
    record = EpisodeRecord(prompt.prompt_id, prompt.ground_truth, record_seed(prompt.prompt_id), prompt.text)
    try:
        ((_, rebuilt),) = list(runner.run([(tuple(prompt.token_ids), record)], generate, max_tokens_per_turn))
    except _Diverged as exc:
        return str(exc)
    if rebuilt.response_ids != tuple(sample.response_ids) or rebuilt.loss_mask != tuple(sample.loss_mask):
        where = _first_difference(rebuilt.response_ids, sample.response_ids)
        return f"the environment's tokens differ from the claimed ones (first at response token {where})"
    return None


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where two sequences differ (the shorter one's length when one extends the other)."""
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))
