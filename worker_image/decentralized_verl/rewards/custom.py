"""User reward functions named `module:function` in the job spec.

The function is imported once per process and cached (`registry.reward_function`). Its signature:

    def my_reward(completion: str, reference, prompt: str | None = None, **options) -> float | RewardResult

It may return a float (or bool/int) or a RewardResult. If it raises, returns something else, or returns
a non-finite number, the sample scores 0.0 with a reason marked as a reward error (`result.failed`, the
traceback in its details for the worker's log): one bad sample never stops training, and the learner
counts such samples per step and stops a job whose rewards all fail (`data.rewardErrorSteps`).
Options it does not accept are not passed (only those named in its signature, unless it takes **kwargs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from traceback import format_exc
from typing import Any

from decentralized_verl.rewards.registry import reward_function
from decentralized_verl.rewards.result import RewardResult, coerce, failed


def call_custom(
    spec: str, completion: Any, reference: Any, prompt: str | None, options: dict[str, Any]
) -> RewardResult:
    """Call the user function for one sample; never raises."""
    try:
        func = reward_function(spec)
    except ValueError as exc:
        return failed(str(exc))
    kwargs = _accepted(func, {"prompt": prompt, **options})
    try:
        value = func(completion, reference, **kwargs)
    except Exception as exc:
        return failed(f"{spec} raised {type(exc).__name__}: {exc}"[:300], traceback=format_exc(limit=-8))
    return coerce(value, f"reward {spec}")


def _accepted(func: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


__all__ = ["RewardResult", "call_custom"]
