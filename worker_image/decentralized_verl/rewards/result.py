"""The value every reward function returns: a score plus the reason a person can read in rollout logs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardResult:
    """A scalar reward and why it was given.

    `reason` is short and stable ("correct", "wrong answer", "no \\boxed{} answer found") so rollout logs
    can be grouped by it; `details` carries extras (extracted answer, per-test outcomes).
    """

    score: float
    reason: str
    details: Mapping[str, Any] | None = field(default=None, compare=False)


ERROR_MARK = "reward error: "
"""How the reason of a reward that failed (raised, returned no number) begins. It travels with the score
as the reason does, so the learner counts a step's failed rewards (`reward_errors`) however the score
reached it: in-process, over gRPC or from a volunteer."""


def zero(reason: str, **details: Any) -> RewardResult:
    """Score 0.0: the answer to every bad input, so a reward never raises into training."""
    return RewardResult(0.0, reason, details or None)


def failed(reason: str, **details: Any) -> RewardResult:
    """Score 0.0 because the reward function itself failed (not because the answer was wrong): counted
    apart, shown to the person running the job, and a job whose rewards all fail is stopped."""
    return zero(ERROR_MARK + reason, **details)


def is_reward_error(reason: str | None) -> bool:
    """Whether a score's reason says its reward function failed (`failed`)."""
    return bool(reason) and reason.startswith(ERROR_MARK)


def coerce(value: Any, source: str) -> RewardResult:
    """Turn what a user function returned (float, int, bool, RewardResult) into a RewardResult.

    Anything else, or a non-finite number, scores 0 with a reason naming `source`.
    """
    if isinstance(value, RewardResult):
        if _finite(value.score):
            return RewardResult(float(value.score), value.reason, value.details)
        return failed(f"{source} returned a non-finite score ({value.score!r})")
    if isinstance(value, bool | int | float):
        if _finite(value):
            return RewardResult(float(value), f"{source} returned {float(value)!r}")
        return failed(f"{source} returned a non-finite score ({value!r})")
    return failed(f"{source} returned {type(value).__name__} {value!r:.80}, expected float or RewardResult")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False
