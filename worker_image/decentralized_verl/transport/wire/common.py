"""Shared by every wire module: role and finish-reason enums, receiver limits, and the small checks
that raise WireError naming the field path."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb

ROLES: dict[str, int] = {
    "rollout": pb.ROLE_ROLLOUT,
    "learner": pb.ROLE_LEARNER,
    "critic": pb.ROLE_CRITIC,
    "reward": pb.ROLE_REWARD,
    "reference": pb.ROLE_REFERENCE,
    "span": pb.ROLE_SPAN,
}
"""Role names as the spec spells them -> the wire enum."""

FINISH_REASONS: dict[str, int] = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "partial": pb.FINISH_REASON_PARTIAL,
}
"""`partial`: a prefix of a response still being generated (the finished result follows), sent by a slow
worker so that, cut off, its work can be continued elsewhere from that prefix."""
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


def _check_version(
    got: int | None, path: str, expected: int | None, max_staleness: int = 0, allow_newer: bool = False
) -> int | None:
    """A version is required when one is expected; it must be within max_staleness below expected.

    `allow_newer` (async RL): a worker that had to fetch weights may get a version published after the
    request was sent (it jumps to the latest); such samples are fresher, not wrong.
    """
    if expected is None:
        return got
    if got is None:
        raise WireError(path, f"is missing (expected {expected})")
    if not expected - max_staleness <= got <= (got if allow_newer else expected):
        low = max(0, expected - max_staleness)
        want = str(expected) if max_staleness == 0 else f"{low}..{expected}"
        if allow_newer:
            want = f">= {low}"
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
