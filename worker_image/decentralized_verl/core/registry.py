"""Name -> object tables for what a job spec names either by a built-in name or as `module:attr`.

Environments (`data.environment.name`) and reward types (`data.rewardType`) work alike: a dict holds the
built-ins, each registered with a decorator, and any other name written `module:attr` is a user object,
imported on first use. The spec checks only the name's shape (torch-free, for the operator); `resolve`
is where the import happens, and its errors name the kind of thing asked for and what went wrong, so a
typo in a manifest reads as one line rather than a traceback.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def register_as(table: dict[str, T], name: str) -> Callable[[T], T]:
    """A decorator that puts its object into `table` under `name` and returns it unchanged."""

    def register(obj: T) -> T:
        table[name] = obj
        return obj

    return register


def resolve(
    table: Mapping[str, T], name: str, *, kind: str, what: str, form: str, pattern: re.Pattern[str]
) -> T:
    """`table[name]`, or the callable a `module:attr` name points at, imported now.

    ValueError otherwise, naming the `kind` ("environment", "reward type"): an unknown name lists the
    built-ins and the `form` a user `what` ("class", "callable") takes; a user name says which import
    failed or which attribute is missing or not callable.
    """
    if name in table:
        return table[name]
    if not pattern.match(name):
        known = ", ".join(sorted(table))
        raise ValueError(f"unknown {kind} {name!r}; expected {known} or a {what} as {form}")
    module_name, attribute = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{kind} {name!r}: cannot import {module_name}: {why}") from None
    obj = getattr(module, attribute, None)
    if not callable(obj):
        raise ValueError(f"{kind} {name!r}: {module_name} has no {what} {attribute}")
    return obj
