"""Protobuf messages <-> small frozen dataclasses, with the checks a receiver must make.

Every message that crosses a process boundary may come from a buggy or dishonest peer (a volunteer's
results are untrusted), so the `*_from_proto` functions validate before anything reaches training:
lengths that must align, NaN/inf numbers, log-probs above 0, token ids outside the vocabulary, empty
responses, a missing or wrong policy version, oversized batches. A violation raises `WireError` whose
text names the field path, e.g. `results[3].logprobs: length 5 does not match response_token_ids
length 6`, so the caller can log the reason and re-dispatch the work.

The `*_to_proto` functions trust their input (it was built by our own code) and only convert.
Pure functions: no gRPC, no I/O, no torch.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb

__all__ = [
    "FINISH_REASONS",
    "LOGPROB_SLACK",
    "ROLES",
    "Completion",
    "CriticTrainItem",
    "GenerateBatch",
    "GenerateItem",
    "Heartbeat",
    "JobStatus",
    "JoinReply",
    "JoinRequest",
    "Readiness",
    "SamplingParams",
    "Score",
    "ScoreItem",
    "SequenceBatch",
    "SequencePair",
    "TokenValues",
    "WeightChunk",
    "WeightManifest",
    "WireError",
    "WireLimits",
    "WorkerInfo",
    "check_all_answered",
    "chunk_from_proto",
    "chunk_to_proto",
    "completion_from_proto",
    "completion_to_proto",
    "critic_train_request_from_proto",
    "critic_train_request_to_proto",
    "generate_request_from_proto",
    "generate_request_to_proto",
    "heartbeat_from_proto",
    "heartbeat_to_proto",
    "job_status_from_proto",
    "job_status_to_proto",
    "join_reply_from_proto",
    "join_reply_to_proto",
    "join_request_from_proto",
    "join_request_to_proto",
    "manifest_from_proto",
    "manifest_to_proto",
    "readiness_from_proto",
    "readiness_to_proto",
    "role_from_name",
    "score_request_from_proto",
    "score_request_to_proto",
    "scores_from_proto",
    "scores_to_proto",
    "sequence_batch_from_proto",
    "sequence_batch_to_proto",
    "token_values_from_proto",
    "token_values_to_proto",
    "worker_info_from_proto",
    "worker_info_to_proto",
]

ROLES: dict[str, int] = {
    "rollout": pb.ROLE_ROLLOUT,
    "learner": pb.ROLE_LEARNER,
    "critic": pb.ROLE_CRITIC,
    "reward": pb.ROLE_REWARD,
    "reference": pb.ROLE_REFERENCE,
}
"""Role names as the spec spells them -> the wire enum."""

FINISH_REASONS: dict[str, int] = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
"""Finish reasons -> the wire enum."""

LOGPROB_SLACK = 1e-4
"""Log-probs up to this much above 0 are accepted: float32/bf16 rounding of a near-certain token's
log-softmax can land a hair above zero. Anything larger is not a log-probability."""

WEIGHT_FORMATS = frozenset({"safetensors"})
"""Serialization formats a weight manifest may name."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
_ROLE_NAMES = {v: k for k, v in ROLES.items()}
_FINISH_NAMES = {v: k for k, v in FINISH_REASONS.items()}


@dataclass(frozen=True)
class WireLimits:
    """What a receiver accepts; built from the job spec (model vocabulary, batch sizes, lengths).

    None disables a check (e.g. a coordinator that does not know the vocabulary size yet).
    """

    vocab_size: int | None = None
    """Token ids must lie in [0, vocab_size)."""
    max_batch: int = 4096
    """Most items one request or response may carry."""
    max_prompt_tokens: int | None = None
    """Longest prompt accepted for generation or scoring."""
    max_new_tokens: int | None = None
    """Largest max_new_tokens a request may ask for."""
    allow_empty_response: bool = False
    """Whether a completion may have no tokens (a generated response always has at least EOS)."""


# ---------------------------------------------------------------------------------------------
# Small checks shared by the converters; each raises WireError naming the path.
# ---------------------------------------------------------------------------------------------


def _check_batch(n: int, path: str, limits: WireLimits) -> None:
    if n == 0:
        raise WireError(path, "must not be empty")
    if n > limits.max_batch:
        raise WireError(path, f"{n} items exceed the limit of {limits.max_batch}")


def _check_tokens(ids: Sequence[int], path: str, vocab_size: int | None) -> None:
    if not ids:
        return
    lo, hi = min(ids), max(ids)
    upper = vocab_size if vocab_size is not None else 2**31
    if lo >= 0 and hi < upper:
        return
    for i, t in enumerate(ids):
        if t < 0 or t >= upper:
            bound = f"[0, {vocab_size})" if vocab_size is not None else "[0, 2**31)"
            raise WireError(f"{path}[{i}]", f"token id {t} is outside {bound}")


def _check_floats(values: Sequence[float], path: str, *, max_value: float | None = None) -> None:
    """Reject NaN and +-inf, and (for log-probs) values above max_value; names the first bad index."""
    if not values:
        return
    total = sum(values)  # NaN or inf anywhere makes the sum non-finite; float32 inputs cannot overflow it
    if math.isfinite(total) and (max_value is None or max(values) <= max_value):
        return
    for i, v in enumerate(values):
        if math.isnan(v):
            raise WireError(f"{path}[{i}]", "is NaN")
        if math.isinf(v):
            raise WireError(f"{path}[{i}]", f"is {v}")
        if max_value is not None and v > max_value:
            raise WireError(f"{path}[{i}]", f"log-prob must be <= 0 (got {v:g})")


def _check_finite(value: float, path: str, *, minimum: float | None = None) -> None:
    if not math.isfinite(value):
        raise WireError(path, f"must be finite (got {value})")
    if minimum is not None and value < minimum:
        raise WireError(path, f"must be >= {minimum:g} (got {value:g})")


def _check_same_length(a: Sequence[object], a_path: str, b: Sequence[object], b_name: str) -> None:
    if len(a) != len(b):
        raise WireError(a_path, f"length {len(a)} does not match {b_name} length {len(b)}")


def _check_nonempty_text(value: str, path: str) -> None:
    if not value.strip():
        raise WireError(path, "must not be empty")


def _check_version(got: int | None, path: str, expected: int | None, max_staleness: int = 0) -> int | None:
    """A version is required when one is expected; it must be within max_staleness below expected."""
    if expected is None:
        return got
    if got is None:
        raise WireError(path, f"is missing (expected {expected})")
    if not expected - max_staleness <= got <= expected:
        want = str(expected) if max_staleness == 0 else f"{max(0, expected - max_staleness)}..{expected}"
        raise WireError(path, f"got {got}, expected {want}")
    return got


def _optional(msg: object, name: str) -> int | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


def _role(value: int, path: str) -> str:
    try:
        return _ROLE_NAMES[value]
    except KeyError:
        raise WireError(path, f"unknown or unset role ({value})") from None


def role_from_name(name: str) -> int:
    """The wire enum for a spec role name (`rollout`, `learner`, ...); WireError for anything else."""
    try:
        return ROLES[name]
    except KeyError:
        raise WireError("role", f"unknown role {name!r} (one of {', '.join(ROLES)})") from None


# ---------------------------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; `n` completions per item with sample indices item.sample_index + k."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None


@dataclass(frozen=True)
class GenerateItem:
    """One prompt to complete."""

    prompt_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]


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
                prompt_id=it.prompt_id, sample_index=it.sample_index, prompt_token_ids=it.prompt_token_ids
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
        items.append(GenerateItem(it.prompt_id, it.sample_index, ids))
    return GenerateBatch(msg.request_id, version, sampling, tuple(items))


def completion_to_proto(c: Completion) -> pb.GenerateResult:
    return pb.GenerateResult(
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
    _check_version(version, f"{path}.policy_version", expected_version, max_staleness)
    ids = tuple(msg.response_token_ids)
    logprobs = tuple(msg.logprobs)
    if not ids and not limits.allow_empty_response:
        raise WireError(f"{path}.response_token_ids", "must not be empty")
    if request is not None and len(ids) > request.sampling.max_new_tokens:
        raise WireError(
            f"{path}.response_token_ids",
            f"length {len(ids)} exceeds max_new_tokens {request.sampling.max_new_tokens}",
        )
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
    )


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


# ---------------------------------------------------------------------------------------------
# Reference and critic
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Reward
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreItem:
    """One completion to score with the named reward."""

    prompt_text: str
    completion_text: str
    ground_truth: str
    reward_type: str


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


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightManifest:
    """Everything a receiver needs to verify a weight version chunk by chunk and as a whole."""

    version: int
    total_bytes: int
    sha256: str
    chunk_sha256: tuple[str, ...]
    chunk_bytes: int
    format: str = "safetensors"
    dtype: str = "float32"
    is_adapter: bool = False

    def chunk_size(self, index: int) -> int:
        """Bytes in chunk `index`: chunk_bytes for all but the last, the remainder for the last."""
        if index < len(self.chunk_sha256) - 1:
            return self.chunk_bytes
        return self.total_bytes - self.chunk_bytes * (len(self.chunk_sha256) - 1)


@dataclass(frozen=True)
class WeightChunk:
    """One verified piece of a weight version."""

    version: int
    index: int
    total: int
    data: bytes
    sha256: str
    manifest: WeightManifest | None = field(default=None, compare=False)


def manifest_to_proto(m: WeightManifest) -> pb.WeightManifest:
    return pb.WeightManifest(
        version=m.version,
        total_bytes=m.total_bytes,
        sha256=m.sha256,
        chunk_sha256=list(m.chunk_sha256),
        chunk_bytes=m.chunk_bytes,
        format=m.format,
        dtype=m.dtype,
        is_adapter=m.is_adapter,
    )


def manifest_from_proto(msg: pb.WeightManifest, path: str = "manifest") -> WeightManifest:
    """Validate a manifest: known format, well-formed hashes, a chunk count that fits the sizes."""
    if msg.format not in WEIGHT_FORMATS:
        known = ", ".join(sorted(WEIGHT_FORMATS))
        raise WireError(f"{path}.format", f"unsupported format {msg.format!r} (one of {known})")
    _check_nonempty_text(msg.dtype, f"{path}.dtype")
    if not _HEX64.fullmatch(msg.sha256):
        raise WireError(f"{path}.sha256", "must be 64 lowercase hex digits")
    for i, h in enumerate(msg.chunk_sha256):
        if not _HEX64.fullmatch(h):
            raise WireError(f"{path}.chunk_sha256[{i}]", "must be 64 lowercase hex digits")
    if msg.total_bytes == 0:
        raise WireError(f"{path}.total_bytes", "must be > 0")
    if msg.chunk_bytes == 0:
        raise WireError(f"{path}.chunk_bytes", "must be > 0")
    want = -(-msg.total_bytes // msg.chunk_bytes)
    if len(msg.chunk_sha256) != want:
        raise WireError(
            f"{path}.chunk_sha256",
            f"{len(msg.chunk_sha256)} chunk hashes, but {msg.total_bytes} bytes in chunks of "
            f"{msg.chunk_bytes} make {want}",
        )
    return WeightManifest(
        version=msg.version,
        total_bytes=msg.total_bytes,
        sha256=msg.sha256,
        chunk_sha256=tuple(msg.chunk_sha256),
        chunk_bytes=msg.chunk_bytes,
        format=msg.format,
        dtype=msg.dtype,
        is_adapter=msg.is_adapter,
    )


def chunk_to_proto(c: WeightChunk) -> pb.WeightChunk:
    msg = pb.WeightChunk(version=c.version, index=c.index, total=c.total, data=c.data, sha256=c.sha256)
    if c.manifest is not None:
        msg.manifest.CopyFrom(manifest_to_proto(c.manifest))
    return msg


def chunk_from_proto(msg: pb.WeightChunk, manifest: WeightManifest, path: str = "chunk") -> WeightChunk:
    """Validate one chunk against the manifest of its version: place, size and both hashes."""
    if msg.version != manifest.version:
        raise WireError(f"{path}.version", f"got {msg.version}, expected {manifest.version}")
    n = len(manifest.chunk_sha256)
    if msg.total != n:
        raise WireError(f"{path}.total", f"got {msg.total}, the manifest has {n} chunks")
    if msg.index >= n:
        raise WireError(f"{path}.index", f"{msg.index} is outside [0, {n})")
    size = manifest.chunk_size(msg.index)
    if len(msg.data) != size:
        raise WireError(f"{path}.data", f"{len(msg.data)} bytes, chunk {msg.index} must have {size}")
    digest = hashlib.sha256(msg.data).hexdigest()
    if msg.sha256 != digest:
        raise WireError(f"{path}.sha256", f"does not match the data (data hashes to {digest[:12]}...)")
    if digest != manifest.chunk_sha256[msg.index]:
        raise WireError(f"{path}.sha256", f"does not match the manifest's chunk_sha256[{msg.index}]")
    attached = manifest_from_proto(msg.manifest, f"{path}.manifest") if msg.HasField("manifest") else None
    return WeightChunk(msg.version, msg.index, msg.total, bytes(msg.data), digest, attached)


# ---------------------------------------------------------------------------------------------
# Coordinator status
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of training progress, as the operator writes it into `.status`."""

    step: int = 0
    total_steps: int = 0
    phase: str = ""
    state: str = "Pending"
    reward_mean: float = 0.0
    reward_std: float = 0.0
    kl: float = 0.0
    response_length_mean: float = 0.0
    policy_version: int = 0
    tokens_per_second: float = 0.0
    phase_seconds: tuple[tuple[str, float], ...] = ()
    last_checkpoint: str = ""
    eval_accuracy: float | None = None
    volunteers: int = 0
    blocked_peers: tuple[tuple[str, str], ...] = ()
    """(peer id, reason) in blocking order."""


def job_status_to_proto(s: JobStatus) -> pb.JobStatus:
    msg = pb.JobStatus(
        step=s.step,
        total_steps=s.total_steps,
        phase=s.phase,
        state=s.state,
        reward_mean=s.reward_mean,
        reward_std=s.reward_std,
        kl=s.kl,
        response_length_mean=s.response_length_mean,
        policy_version=s.policy_version,
        tokens_per_second=s.tokens_per_second,
        phase_seconds=dict(s.phase_seconds),
        last_checkpoint=s.last_checkpoint,
        volunteers=s.volunteers,
        blocked_peers=[pb.BlockedPeer(peer_id=p, reason=r) for p, r in s.blocked_peers],
    )
    if s.eval_accuracy is not None:
        msg.eval_accuracy = s.eval_accuracy
    return msg


def job_status_from_proto(msg: pb.JobStatus) -> JobStatus:
    """Validate a Status reply: finite numbers, non-negative durations, accuracy in [0, 1]."""
    _check_nonempty_text(msg.state, "state")
    if msg.total_steps and msg.step > msg.total_steps:
        raise WireError("step", f"{msg.step} exceeds total_steps {msg.total_steps}")
    for name in ("reward_mean", "reward_std", "kl", "response_length_mean", "tokens_per_second"):
        _check_finite(getattr(msg, name), name)
    for name in ("reward_std", "response_length_mean", "tokens_per_second"):
        _check_finite(getattr(msg, name), name, minimum=0.0)
    for key in sorted(msg.phase_seconds):
        _check_finite(msg.phase_seconds[key], f"phase_seconds[{key!r}]", minimum=0.0)
    accuracy = _optional(msg, "eval_accuracy")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise WireError("eval_accuracy", f"must be in [0, 1] (got {accuracy})")
    for i, peer in enumerate(msg.blocked_peers):
        _check_nonempty_text(peer.peer_id, f"blocked_peers[{i}].peer_id")
    return JobStatus(
        step=msg.step,
        total_steps=msg.total_steps,
        phase=msg.phase,
        state=msg.state,
        reward_mean=msg.reward_mean,
        reward_std=msg.reward_std,
        kl=msg.kl,
        response_length_mean=msg.response_length_mean,
        policy_version=msg.policy_version,
        tokens_per_second=msg.tokens_per_second,
        phase_seconds=tuple(sorted(msg.phase_seconds.items())),
        last_checkpoint=msg.last_checkpoint,
        eval_accuracy=accuracy,
        volunteers=msg.volunteers,
        blocked_peers=tuple((p.peer_id, p.reason) for p in msg.blocked_peers),
    )


# ---------------------------------------------------------------------------------------------
# Volunteers and health
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinRequest:
    """A volunteer asking to serve a role in a job."""

    job: str
    token: str
    role: str
    hardware: str
    tokens_per_second: float

    def __repr__(self) -> str:  # the token is a credential: keep it out of logs
        return (
            f"JoinRequest(job={self.job!r}, token='***', role={self.role!r}, "
            f"hardware={self.hardware!r}, tokens_per_second={self.tokens_per_second!r})"
        )


@dataclass(frozen=True)
class JoinReply:
    """The coordinator's decision on a join request."""

    accepted: bool
    peer_id: str = ""
    reason: str = ""
    policy_version: int = 0
    weights_address: str = ""


@dataclass(frozen=True)
class Heartbeat:
    """A joined volunteer's sign of life."""

    peer_id: str
    policy_version: int
    load: float


@dataclass(frozen=True)
class Readiness:
    """Whether a worker can take work."""

    ready: bool
    role: str
    worker_id: str


def join_request_to_proto(j: JoinRequest) -> pb.JoinRequest:
    return pb.JoinRequest(
        job=j.job,
        token=j.token,
        role=ROLES[j.role],
        hardware=j.hardware,
        tokens_per_second=j.tokens_per_second,
    )


def join_request_from_proto(msg: pb.JoinRequest) -> JoinRequest:
    """Validate a join request's shape (the token's signature is checked by the trust layer)."""
    _check_nonempty_text(msg.job, "job")
    _check_nonempty_text(msg.token, "token")
    role = _role(msg.role, "role")
    _check_finite(msg.tokens_per_second, "tokens_per_second", minimum=0.0)
    return JoinRequest(msg.job, msg.token, role, msg.hardware, msg.tokens_per_second)


def join_reply_to_proto(r: JoinReply) -> pb.JoinReply:
    return pb.JoinReply(
        accepted=r.accepted,
        peer_id=r.peer_id,
        reason=r.reason,
        policy_version=r.policy_version,
        weights_address=r.weights_address,
    )


def join_reply_from_proto(msg: pb.JoinReply) -> JoinReply:
    """Validate a join reply: an accepted volunteer needs a peer id and a weights address."""
    if msg.accepted:
        _check_nonempty_text(msg.peer_id, "peer_id")
        _check_nonempty_text(msg.weights_address, "weights_address")
    else:
        _check_nonempty_text(msg.reason, "reason")
    return JoinReply(msg.accepted, msg.peer_id, msg.reason, msg.policy_version, msg.weights_address)


def heartbeat_to_proto(h: Heartbeat) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(peer_id=h.peer_id, policy_version=h.policy_version, load=h.load)


def heartbeat_from_proto(msg: pb.HeartbeatRequest) -> Heartbeat:
    _check_nonempty_text(msg.peer_id, "peer_id")
    _check_finite(msg.load, "load", minimum=0.0)
    if msg.load > 1.0:
        raise WireError("load", f"must be in [0, 1] (got {msg.load:g})")
    return Heartbeat(msg.peer_id, msg.policy_version, msg.load)


def readiness_to_proto(r: Readiness) -> pb.ReadyReply:
    return pb.ReadyReply(ready=r.ready, role=ROLES[r.role], worker_id=r.worker_id)


def readiness_from_proto(msg: pb.ReadyReply) -> Readiness:
    _check_nonempty_text(msg.worker_id, "worker_id")
    return Readiness(msg.ready, _role(msg.role, "role"), msg.worker_id)
