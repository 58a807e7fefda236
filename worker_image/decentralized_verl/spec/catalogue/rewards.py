"""The reward types a spec can name (`data.rewardType`): a built-in, which `rewards/registry.py` serves
and checks against this list, or a user callable written `module:function`."""

from __future__ import annotations

import re

BUILTIN_REWARD_TYPES: tuple[str, ...] = ("boxed", "think_answer_tags", "code", "reward_model")
CALLABLE_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_known_reward_type(name: str) -> bool:
    """A built-in reward type, or a user callable written as `module:function`."""
    return name in BUILTIN_REWARD_TYPES or bool(CALLABLE_PATTERN.match(name))
