"""Reference log-probs, critic values and training, reward scores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from decentralized_verl.environments.replay import ENVIRONMENT_REWARD, transcript
from decentralized_verl.transport.wire.common import (
    LOGPROB_SLACK,
    WireError,
    WireLimits,
    _check_batch,
    _check_finite,
    _check_floats,
    _check_nonempty_text,
    _check_same_length,
    _check_tokens,
    _check_version,
    _optional,
    pb,
)


@dataclass(frozen=True)
class SequencePair:
    """A prompt and a response as token ids."""

    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class SequenceBatch:
    """Sequences to evaluate (reference log-probs, critic values) for a policy version."""

    items: tuple[SequencePair, ...]
    policy_version: int | None = None


@dataclass(frozen=True)
class TokenValues:
    """Per-token numbers for a batch, aligned with the request's items."""

    values: tuple[tuple[float, ...], ...]
    policy_version: int | None
    worker_id: str


def _pair_to_proto(p: SequencePair) -> pb.Sequence:
    return pb.Sequence(prompt_token_ids=p.prompt_token_ids, response_token_ids=p.response_token_ids)


def _pair_from_proto(msg: pb.Sequence, path: str, limits: WireLimits) -> SequencePair:
    prompt, response = tuple(msg.prompt_token_ids), tuple(msg.response_token_ids)
    if not prompt:
        raise WireError(f"{path}.prompt_token_ids", "must not be empty")
    if limits.max_prompt_tokens is not None and len(prompt) > limits.max_prompt_tokens:
        raise WireError(
            f"{path}.prompt_token_ids",
            f"length {len(prompt)} exceeds the prompt limit of {limits.max_prompt_tokens}",
        )
    if not response and not limits.allow_empty_response:
        raise WireError(f"{path}.response_token_ids", "must not be empty")
    _check_tokens(prompt, f"{path}.prompt_token_ids", limits.vocab_size)
    _check_tokens(response, f"{path}.response_token_ids", limits.vocab_size)
    return SequencePair(prompt, response)


def sequence_batch_to_proto(batch: SequenceBatch) -> pb.SequenceBatch:
    msg = pb.SequenceBatch(items=[_pair_to_proto(p) for p in batch.items])
    if batch.policy_version is not None:
        msg.policy_version = batch.policy_version
    return msg


def sequence_batch_from_proto(msg: pb.SequenceBatch, limits: WireLimits) -> SequenceBatch:
    """Validate a LogProbs / Values request as a reference or critic worker receives it."""
    _check_batch(len(msg.items), "items", limits)
    items = tuple(_pair_from_proto(it, f"items[{i}]", limits) for i, it in enumerate(msg.items))
    return SequenceBatch(items, _optional(msg, "policy_version"))


def token_values_to_proto(tv: TokenValues) -> pb.TokenValuesBatch:
    msg = pb.TokenValuesBatch(results=[pb.TokenValues(values=v) for v in tv.values], worker_id=tv.worker_id)
    if tv.policy_version is not None:
        msg.policy_version = tv.policy_version
    return msg


def token_values_from_proto(
    msg: pb.TokenValuesBatch,
    request: SequenceBatch,
    *,
    logprobs: bool,
    expected_version: int | None = None,
    max_staleness: int = 0,
) -> TokenValues:
    """Validate a LogProbs (logprobs=True: also <= 0) or Values reply against the request it answers."""
    _check_same_length(msg.results, "results", request.items, "request items")
    version = _check_version(
        _optional(msg, "policy_version"), "policy_version", expected_version, max_staleness
    )
    out = []
    for i, (res, item) in enumerate(zip(msg.results, request.items, strict=True)):
        values = tuple(res.values)
        _check_same_length(values, f"results[{i}].values", item.response_token_ids, "response_token_ids")
        _check_floats(values, f"results[{i}].values", max_value=LOGPROB_SLACK if logprobs else None)
        out.append(values)
    return TokenValues(tuple(out), version, msg.worker_id)


@dataclass(frozen=True)
class CriticTrainItem:
    """One sequence with its value targets and rollout-time values."""

    sequence: SequencePair
    returns: tuple[float, ...]
    old_values: tuple[float, ...]


def critic_train_request_to_proto(
    items: Sequence[CriticTrainItem], policy_version: int
) -> pb.CriticTrainRequest:
    return pb.CriticTrainRequest(
        items=[
            pb.CriticTrainItem(
                sequence=_pair_to_proto(it.sequence), returns=it.returns, old_values=it.old_values
            )
            for it in items
        ],
        policy_version=policy_version,
    )


def critic_train_request_from_proto(
    msg: pb.CriticTrainRequest, limits: WireLimits
) -> tuple[tuple[CriticTrainItem, ...], int]:
    """Validate a critic Train request: targets aligned with responses and finite."""
    _check_batch(len(msg.items), "items", limits)
    items = []
    for i, it in enumerate(msg.items):
        path = f"items[{i}]"
        if not it.HasField("sequence"):
            raise WireError(f"{path}.sequence", "is missing")
        pair = _pair_from_proto(it.sequence, f"{path}.sequence", limits)
        returns, old = tuple(it.returns), tuple(it.old_values)
        n = pair.response_token_ids
        _check_same_length(returns, f"{path}.returns", n, "response_token_ids")
        _check_same_length(old, f"{path}.old_values", n, "response_token_ids")
        _check_floats(returns, f"{path}.returns")
        _check_floats(old, f"{path}.old_values")
        items.append(CriticTrainItem(pair, returns, old))
    return tuple(items), msg.policy_version


@dataclass(frozen=True)
class ScoreItem:
    """One completion to score with the named reward."""

    prompt_text: str
    completion_text: str
    ground_truth: str
    reward_type: str

    @classmethod
    def of(cls, sample: Any, reward_type: str) -> ScoreItem:
        """The item that scores `sample`: its text, or for the `environment` reward its episode's transcript
        (the model's turns, which the reward worker replays its environment on)."""
        text = sample.text
        if reward_type == ENVIRONMENT_REWARD:
            text = transcript(sample.prompt.prompt_id, sample.turns)
        return cls(sample.prompt.text, text, sample.prompt.ground_truth, reward_type)


@dataclass(frozen=True)
class Score:
    """A reward and why."""

    score: float
    reason: str = ""


def score_request_to_proto(items: Sequence[ScoreItem]) -> pb.ScoreRequest:
    return pb.ScoreRequest(
        items=[
            pb.ScoreItem(
                prompt_text=it.prompt_text,
                completion_text=it.completion_text,
                ground_truth=it.ground_truth,
                reward_type=it.reward_type,
            )
            for it in items
        ]
    )


def score_request_from_proto(msg: pb.ScoreRequest, limits: WireLimits) -> tuple[ScoreItem, ...]:
    """Validate a Score request as a reward worker receives it."""
    _check_batch(len(msg.items), "items", limits)
    out = []
    for i, it in enumerate(msg.items):
        _check_nonempty_text(it.reward_type, f"items[{i}].reward_type")
        out.append(ScoreItem(it.prompt_text, it.completion_text, it.ground_truth, it.reward_type))
    return tuple(out)


def scores_to_proto(scores: Sequence[Score]) -> pb.ScoreResponse:
    return pb.ScoreResponse(results=[pb.ScoreResult(score=s.score, reason=s.reason) for s in scores])


def scores_from_proto(msg: pb.ScoreResponse, n_items: int) -> tuple[Score, ...]:
    """Validate a Score reply: one finite score per requested item."""
    if len(msg.results) != n_items:
        raise WireError("results", f"length {len(msg.results)} does not match request items length {n_items}")
    out = []
    for i, r in enumerate(msg.results):
        _check_finite(r.score, f"results[{i}].score")
        out.append(Score(r.score, r.reason))
    return tuple(out)
