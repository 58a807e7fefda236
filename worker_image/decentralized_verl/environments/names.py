"""Environment names the spec accepts (imports nothing heavy, so the operator can validate manifests)."""

from __future__ import annotations

import re

BUILTIN_ENVIRONMENTS: tuple[str, ...] = ("calculator", "guessing_game", "python_tool", "verifiers")
CLASS_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""A user environment written as `module:Class` (the class follows `base.Environment`)."""


def is_known_environment(name: str) -> bool:
    return name in BUILTIN_ENVIRONMENTS or bool(CLASS_PATTERN.match(name))
