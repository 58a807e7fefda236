"""Rollout requests and results: sampling parameters, prompts in, completions out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.transport.wire.common import (
    _FINISH_NAMES,
    FINISH_REASONS,
    LOGPROB_SLACK,
    ROLES,
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
    _role,
    pb,
)


@dataclass(frozen=True)
class GenerateItem:
    """One prompt to complete (with an environment: one episode to play on its record)."""

    prompt_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    ground_truth: str = ""
    prompt_text: str = ""


@dataclass(frozen=True)
class GenerateBatch:
    """A generation request: prompts, sampling parameters and the policy version to use."""

    request_id: str
    policy_version: int
    sampling: SamplingParams
    items: tuple[GenerateItem, ...]

    def expected_keys(self) -> list[tuple[str, int]]:
        """Every (prompt_id, sample_index) the request must be answered with, in order."""
        return [
            (item.prompt_id, item.sample_index + k) for item in self.items for k in range(self.sampling.n)
        ]

    @cached_property
    def expected_key_set(self) -> frozenset[tuple[str, int]]:
        """The same keys as a set, computed once per request (each streamed result is checked in it)."""
        return frozenset(self.expected_keys())


@dataclass(frozen=True)
class EpisodeReport:
    """What a multi-turn completion adds: which tokens are the model's, its turns and how it ended."""

    loss_mask: tuple[int, ...]
    turns: tuple[str, ...]
    end_reason: str
    tool_calls: int
    tool_errors: int
    reward: float


MAX_TURNS = 64
"""The most model turns an episode may have (`data.environment.maxTurns`' own limit)."""


@dataclass(frozen=True)
class Completion:
    """One finished completion with its per-token log-probs."""

    request_id: str
    prompt_id: str
    sample_index: int
    response_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    text: str
    policy_version: int
    worker_id: str
    generation_seconds: float
    episode: EpisodeReport | None = None

    @property
    def key(self) -> tuple[str, int]:
        """Identifies the sample this completes; each key is answered exactly once per step."""
        return (self.prompt_id, self.sample_index)


def sampling_to_proto(s: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop=list(s.stop),
        n=s.n,
    )
    if s.seed is not None:
        msg.seed = s.seed
    return msg


def sampling_from_proto(msg: pb.SamplingParams, limits: WireLimits, path: str = "sampling") -> SamplingParams:
    if msg.max_new_tokens < 1:
        raise WireError(f"{path}.max_new_tokens", f"must be >= 1 (got {msg.max_new_tokens})")
    if limits.max_new_tokens is not None and msg.max_new_tokens > limits.max_new_tokens:
        raise WireError(
            f"{path}.max_new_tokens", f"{msg.max_new_tokens} exceeds the limit of {limits.max_new_tokens}"
        )
    _check_finite(msg.temperature, f"{path}.temperature", minimum=0.0)
    _check_finite(msg.top_p, f"{path}.top_p")
    if not 0.0 < msg.top_p <= 1.0:
        raise WireError(f"{path}.top_p", f"must be in (0, 1] (got {msg.top_p:g})")
    if msg.top_k < 0:
        raise WireError(f"{path}.top_k", f"must be >= 0 (got {msg.top_k})")
    if msg.n < 1:
        raise WireError(f"{path}.n", f"must be >= 1 (got {msg.n})")
    for i, stop in enumerate(msg.stop):
        if not stop:
            raise WireError(f"{path}.stop[{i}]", "must not be empty")
    return SamplingParams(
        max_new_tokens=msg.max_new_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        stop=tuple(msg.stop),
        n=msg.n,
        seed=_optional(msg, "seed"),
    )


def generate_request_to_proto(batch: GenerateBatch) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=batch.request_id,
        policy_version=batch.policy_version,
        sampling=sampling_to_proto(batch.sampling),
        items=[
            pb.GenerateItem(
                prompt_id=it.prompt_id,
                sample_index=it.sample_index,
                prompt_token_ids=it.prompt_token_ids,
                ground_truth=it.ground_truth,
                prompt_text=it.prompt_text,
            )
            for it in batch.items
        ],
    )


def generate_request_from_proto(msg: pb.GenerateRequest, limits: WireLimits) -> GenerateBatch:
    """Validate a generation request as a rollout worker receives it."""
    _check_nonempty_text(msg.request_id, "request_id")
    version = _optional(msg, "policy_version")
    if version is None:
        raise WireError("policy_version", "is missing")
    if not msg.HasField("sampling"):
        raise WireError("sampling", "is missing")
    sampling = sampling_from_proto(msg.sampling, limits)
    _check_batch(len(msg.items) * sampling.n, "items", limits)
    items = []
    seen: dict[tuple[str, int], int] = {}
    for i, it in enumerate(msg.items):
        path = f"items[{i}]"
        _check_nonempty_text(it.prompt_id, f"{path}.prompt_id")
        if it.sample_index < 0:
            raise WireError(f"{path}.sample_index", f"must be >= 0 (got {it.sample_index})")
        for k in range(sampling.n):
            key = (it.prompt_id, it.sample_index + k)
            if key in seen:
                raise WireError(
                    f"{path}.sample_index",
                    f"sample {key[1]} of prompt {key[0]!r} is already requested by items[{seen[key]}]",
                )
            seen[key] = i
        ids = tuple(it.prompt_token_ids)
        if not ids:
            raise WireError(f"{path}.prompt_token_ids", "must not be empty")
        if limits.max_prompt_tokens is not None and len(ids) > limits.max_prompt_tokens:
            raise WireError(
                f"{path}.prompt_token_ids",
                f"length {len(ids)} exceeds the prompt limit of {limits.max_prompt_tokens}",
            )
        _check_tokens(ids, f"{path}.prompt_token_ids", limits.vocab_size)
        items.append(GenerateItem(it.prompt_id, it.sample_index, ids, it.ground_truth, it.prompt_text))
    return GenerateBatch(msg.request_id, version, sampling, tuple(items))


def completion_to_proto(c: Completion) -> pb.GenerateResult:
    episode = None
    if c.episode is not None:
        e = c.episode
        episode = pb.Episode(
            loss_mask=[bool(m) for m in e.loss_mask],
            turns=list(e.turns),
            end_reason=e.end_reason,
            tool_calls=e.tool_calls,
            tool_errors=e.tool_errors,
            reward=e.reward,
        )
    return pb.GenerateResult(
        episode=episode,
        request_id=c.request_id,
        prompt_id=c.prompt_id,
        sample_index=c.sample_index,
        response_token_ids=c.response_token_ids,
        logprobs=c.logprobs,
        finish_reason=FINISH_REASONS[c.finish_reason],
        text=c.text,
        policy_version=c.policy_version,
        worker_id=c.worker_id,
        generation_seconds=c.generation_seconds,
    )


def completion_from_proto(
    msg: pb.GenerateResult,
    *,
    limits: WireLimits,
    request: GenerateBatch | None = None,
    expected_version: int | None = None,
    max_staleness: int = 0,
    path: str = "result",
    allow_newer: bool = False,
) -> Completion:
    """Validate one streamed result as the coordinator receives it.

    With `request`, the result must answer that request (id, a requested sample, no more tokens than
    asked) and its version defaults to the request's. `path` prefixes error fields, e.g. `results[3]`.
    """
    if request is not None:
        if msg.request_id != request.request_id:
            raise WireError(
                f"{path}.request_id", f"{msg.request_id!r} does not match the request {request.request_id!r}"
            )
        if expected_version is None:
            expected_version = request.policy_version
    _check_nonempty_text(msg.prompt_id, f"{path}.prompt_id")
    if msg.sample_index < 0:
        raise WireError(f"{path}.sample_index", f"must be >= 0 (got {msg.sample_index})")
    if request is not None and (msg.prompt_id, msg.sample_index) not in request.expected_key_set:
        raise WireError(
            f"{path}.sample_index",
            f"sample {msg.sample_index} of prompt {msg.prompt_id!r} was not requested",
        )
    version = _optional(msg, "policy_version")
    if version is None:
        raise WireError(f"{path}.policy_version", "is missing")
    _check_version(version, f"{path}.policy_version", expected_version, max_staleness, allow_newer)
    ids = tuple(msg.response_token_ids)
    logprobs = tuple(msg.logprobs)
    if not ids and not limits.allow_empty_response:
        raise WireError(f"{path}.response_token_ids", "must not be empty")
    episode = _episode_from_proto(msg, ids, path) if msg.HasField("episode") else None
    if request is not None and episode is None and len(ids) > request.sampling.max_new_tokens:
        raise WireError(
            f"{path}.response_token_ids",
            f"length {len(ids)} exceeds max_new_tokens {request.sampling.max_new_tokens}",
        )
    if request is not None and episode is not None:
        _check_turn_lengths(episode, request.sampling.max_new_tokens, path)
    _check_tokens(ids, f"{path}.response_token_ids", limits.vocab_size)
    _check_same_length(logprobs, f"{path}.logprobs", ids, "response_token_ids")
    _check_floats(logprobs, f"{path}.logprobs", max_value=LOGPROB_SLACK)
    try:
        finish = _FINISH_NAMES[msg.finish_reason]
    except KeyError:
        raise WireError(f"{path}.finish_reason", f"unknown or unset ({msg.finish_reason})") from None
    _check_nonempty_text(msg.worker_id, f"{path}.worker_id")
    _check_finite(msg.generation_seconds, f"{path}.generation_seconds", minimum=0.0)
    return Completion(
        request_id=msg.request_id,
        prompt_id=msg.prompt_id,
        sample_index=msg.sample_index,
        response_token_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        text=msg.text,
        policy_version=version,
        worker_id=msg.worker_id,
        generation_seconds=msg.generation_seconds,
        episode=episode,
    )


def _episode_from_proto(msg: pb.GenerateResult, ids: tuple[int, ...], path: str) -> EpisodeReport:
    """A multi-turn result's episode: a mask per token, one model turn per run of model tokens."""
    e = msg.episode
    where = f"{path}.episode"
    mask = tuple(int(m) for m in e.loss_mask)
    _check_same_length(mask, f"{where}.loss_mask", ids, "response_token_ids")
    if len(e.turns) > MAX_TURNS:
        raise WireError(f"{where}.turns", f"{len(e.turns)} turns exceed the limit of {MAX_TURNS}")
    runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    if runs != len(e.turns) or not mask or not mask[0]:
        raise WireError(
            f"{where}.loss_mask",
            f"must start with the model's tokens and hold one run of them per turn "
            f"({runs} runs for {len(e.turns)} turns)",
        )
    _check_finite(e.reward, f"{where}.reward")
    return EpisodeReport(mask, tuple(e.turns), e.end_reason, e.tool_calls, e.tool_errors, e.reward)


def _check_turn_lengths(episode: EpisodeReport, max_new_tokens: int, path: str) -> None:
    """No model turn longer than the request allows a turn to be."""
    run = 0
    for m in (*episode.loss_mask, 0):
        if m:
            run += 1
            continue
        if run > max_new_tokens:
            raise WireError(
                f"{path}.episode.loss_mask",
                f"a model turn of {run} tokens exceeds max_new_tokens {max_new_tokens}",
            )
        run = 0


def check_all_answered(request: GenerateBatch, completions: Iterable[Completion]) -> None:
    """Every requested sample answered exactly once, nothing extra (order of arrival is free)."""
    expected = request.expected_key_set
    seen: dict[tuple[str, int], int] = {}
    for i, c in enumerate(completions):
        if c.key not in expected:
            raise WireError(
                f"results[{i}]", f"sample {c.sample_index} of prompt {c.prompt_id!r} was not requested"
            )
        if c.key in seen:
            raise WireError(
                f"results[{i}]",
                f"sample {c.sample_index} of prompt {c.prompt_id!r} "
                f"already answered by results[{seen[c.key]}]",
            )
        seen[c.key] = i
    missing = [k for k in request.expected_keys() if k not in seen]
    if missing:
        shown = ", ".join(f"{p}#{s}" for p, s in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise WireError("results", f"{len(missing)} requested samples not answered: {shown}")


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports about itself (dispatch weights by tokens_per_second)."""

    worker_id: str
    role: str
    policy_version: int
    tokens_per_second: float
    backend: str


def worker_info_to_proto(w: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        worker_id=w.worker_id,
        role=ROLES[w.role],
        policy_version=w.policy_version,
        tokens_per_second=w.tokens_per_second,
        backend=w.backend,
    )


def worker_info_from_proto(msg: pb.WorkerInfo) -> WorkerInfo:
    _check_nonempty_text(msg.worker_id, "worker_id")
    role = _role(msg.role, "role")
    _check_finite(msg.tokens_per_second, "tokens_per_second", minimum=0.0)
    _check_nonempty_text(msg.backend, "backend")
    return WorkerInfo(msg.worker_id, role, msg.policy_version, msg.tokens_per_second, msg.backend)
