"""Environments by name: one dict the rollout side's construction comes from, checked at import against
the spec's catalogue (`spec/catalogue/environments.py`), names and options models both.

A built-in is registered with `@environment("name")`; a user environment is named `module:Class` and
imported on first use. Options (`data.environment.options`) are validated against the class's `Options`
model, so an unknown or ill-typed option is refused with its name before any episode runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from decentralized_verl.core.registry import register_as, resolve
from decentralized_verl.environments import apart
from decentralized_verl.environments.base import Environment
from decentralized_verl.environments.calculator import Calculator
from decentralized_verl.environments.guessing_game import GuessingGame
from decentralized_verl.environments.python_tool import PythonTool
from decentralized_verl.environments.verifiers_env import VerifiersEnvironment
from decentralized_verl.spec.catalogue import CatalogueMismatch, check_registry
from decentralized_verl.spec.catalogue.environments import (
    BUILTIN_ENVIRONMENTS,
    CLASS_PATTERN,
    ENVIRONMENT_OPTIONS,
    validate_options,
)

ENVIRONMENTS: dict[str, type] = {}


def environment(name: str) -> Callable[[type], type]:
    """Register a built-in environment class under `name` (listed in the catalogue, with its options)."""
    return register_as(ENVIRONMENTS, name)


environment("calculator")(Calculator)
environment("guessing_game")(GuessingGame)
environment("python_tool")(PythonTool)
environment("verifiers")(VerifiersEnvironment)


def check_against_catalogue(registered: dict[str, type]) -> None:
    """The registered environments are the catalogue's, each with the catalogue's options model: the spec
    checks a built-in's options against that model without importing the class."""
    check_registry("environment", registered, BUILTIN_ENVIRONMENTS)
    for name, cls in registered.items():
        if getattr(cls, "Options", None) is not ENVIRONMENT_OPTIONS[name]:
            raise CatalogueMismatch(
                f"environment {name!r}: {cls.__name__}.Options is not the catalogue's options model "
                "(spec/catalogue/environments.py)"
            )


check_against_catalogue(ENVIRONMENTS)


@functools.lru_cache(maxsize=32)
def environment_class(name: str) -> type:
    """The class behind `name`; ValueError naming what is wrong (unknown name, failed import)."""
    return resolve(
        ENVIRONMENTS, name, kind="environment", what="class", form="module:Class", pattern=CLASS_PATTERN
    )


def parse_options(name: str, options: Mapping[str, Any]) -> BaseModel | None:
    """The class's `Options` validated from the spec's mapping; EnvironmentOptionsError naming the option."""
    return validate_options(name, getattr(environment_class(name), "Options", None), options)


def preflight(name: str, options: Mapping[str, Any] | None = None) -> None:
    """Check what episodes will need before the first one: the options, and the class's own `preflight`
    when it has one (an optional package, files it reads); ValueError naming what is missing. A user's
    environment in a process that holds secrets is checked in its child (`apart`)."""
    if apart.runs_apart(name):
        apart.preflight_apart(name, dict(options or {}))
        return
    parsed = parse_options(name, options or {})
    check = getattr(environment_class(name), "preflight", None)
    if callable(check):
        check(parsed)


def make_environment(
    name: str, options: Mapping[str, Any] | None = None, *, timeout_s: float = apart.CALL_TIMEOUT_S
) -> Environment:
    """A fresh environment for one episode; a user's, in a process that holds secrets, lives in the child
    (`apart`), each of its calls answered within `timeout_s`."""
    if apart.runs_apart(name):
        return apart.make_apart(name, dict(options or {}), timeout_s)
    cls = environment_class(name)
    parsed = parse_options(name, options or {})
    return cls(parsed) if parsed is not None else cls()


def instructions(name: str) -> str:
    """The environment's usage text for the model ("" when it has none)."""
    if apart.runs_apart(name):
        return apart.instructions_apart(name)
    return str(getattr(environment_class(name), "instructions", "") or "")
