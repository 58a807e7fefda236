"""Reward type names the spec accepts (torch-free so the operator can validate manifests)."""

from __future__ import annotations

import re

BUILTIN_REWARD_TYPES: tuple[str, ...] = ("boxed", "think_answer_tags", "code", "reward_model")
CALLABLE_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_known_reward_type(name: str) -> bool:
    """A built-in reward type, or a user callable written as `module:function`."""
    return name in BUILTIN_REWARD_TYPES or bool(CALLABLE_PATTERN.match(name))
