"""Reward types by name: one dict `score` dispatches through, checked at import against the names the
spec accepts (`spec/catalogue/rewards.py`).

Importing this module imports no torch, transformers or sympy (those load lazily inside the functions).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from decentralized_verl.core.registry import register_as, resolve
from decentralized_verl.rewards.code_reward import code_reward
from decentralized_verl.rewards.math_rewards import boxed_reward, think_answer_tags_reward
from decentralized_verl.rewards.result import RewardResult
from decentralized_verl.rewards.reward_model import reward_model_reward
from decentralized_verl.spec.catalogue import check_registry
from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES, CALLABLE_PATTERN

RewardFn = Callable[..., RewardResult]
"""fn(completion: str, reference, *, prompt=None, **options) -> RewardResult"""

REWARD_TYPES: dict[str, RewardFn] = {}


def reward_type(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a built-in reward function under `name` (listed in the catalogue)."""
    return register_as(REWARD_TYPES, name)


reward_type("boxed")(boxed_reward)
reward_type("think_answer_tags")(think_answer_tags_reward)
reward_type("code")(code_reward)
reward_type("reward_model")(reward_model_reward)

check_registry("reward type", REWARD_TYPES, BUILTIN_REWARD_TYPES)


@functools.lru_cache(maxsize=64)
def reward_function(name: str) -> Callable[..., Any]:
    """The built-in under `name`, or the user function a `module:function` name points at (imported once
    per process and cached); ValueError naming what is wrong (unknown name, failed import, no callable)."""
    return resolve(
        REWARD_TYPES,
        name,
        kind="reward type",
        what="callable",
        form="module:function",
        pattern=CALLABLE_PATTERN,
    )


__all__ = ["REWARD_TYPES", "RewardFn", "reward_function", "reward_type"]
