"""Environments by name: one dict the spec's names and the rollout side's construction both come from.

A built-in is registered with `@environment("name")`; a user environment is named `module:Class` and
imported on first use. Options (`data.environment.options`) are validated against the class's `Options`
model, so an unknown or ill-typed option is refused with its name before any episode runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from decentralized_verl.core.registry import register_as, resolve
from decentralized_verl.environments.base import Environment, EnvironmentOptionsError
from decentralized_verl.environments.calculator import Calculator
from decentralized_verl.environments.guessing_game import GuessingGame
from decentralized_verl.environments.names import BUILTIN_ENVIRONMENTS, CLASS_PATTERN
from decentralized_verl.environments.python_tool import PythonTool
from decentralized_verl.environments.verifiers_env import VerifiersEnvironment

ENVIRONMENTS: dict[str, type] = {}


def environment(name: str) -> Callable[[type], type]:
    """Register a built-in environment class under `name` (also listed in names.BUILTIN_ENVIRONMENTS)."""
    return register_as(ENVIRONMENTS, name)


environment("calculator")(Calculator)
environment("guessing_game")(GuessingGame)
environment("python_tool")(PythonTool)
environment("verifiers")(VerifiersEnvironment)

assert set(ENVIRONMENTS) == set(BUILTIN_ENVIRONMENTS), "names.BUILTIN_ENVIRONMENTS is out of date"


@functools.lru_cache(maxsize=32)
def environment_class(name: str) -> type:
    """The class behind `name`; ValueError naming what is wrong (unknown name, failed import)."""
    return resolve(
        ENVIRONMENTS, name, kind="environment", what="class", form="module:Class", pattern=CLASS_PATTERN
    )


def parse_options(name: str, options: Mapping[str, Any]) -> BaseModel | None:
    """The class's `Options` validated from the spec's mapping; EnvironmentOptionsError naming the option."""
    model = getattr(environment_class(name), "Options", None)
    if model is None:
        if options:
            raise EnvironmentOptionsError(next(iter(options)), f"environment {name!r} takes no options")
        return None
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise EnvironmentOptionsError(where, error["msg"]) from None


def preflight(name: str, options: Mapping[str, Any] | None = None) -> None:
    """Check what episodes will need before the first one: the options, and the class's own `preflight`
    when it has one (an optional package, files it reads); ValueError naming what is missing."""
    parsed = parse_options(name, options or {})
    check = getattr(environment_class(name), "preflight", None)
    if callable(check):
        check(parsed)


def make_environment(name: str, options: Mapping[str, Any] | None = None) -> Environment:
    """A fresh environment for one episode."""
    cls = environment_class(name)
    parsed = parse_options(name, options or {})
    return cls(parsed) if parsed is not None else cls()


def instructions(name: str) -> str:
    """The environment's usage text for the model ("" when it has none)."""
    return str(getattr(environment_class(name), "instructions", "") or "")
