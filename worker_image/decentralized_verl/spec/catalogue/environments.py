"""The environments a spec can name (`data.environment`): a built-in, which `environments/registry.py`
serves and checks against this list, or a user class written `module:Class`; and the options each
built-in takes, so the spec checks them by field without importing the environments themselves."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, PositiveInt, ValidationError

from decentralized_verl.spec.base import SpecModel

CLASS_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""A user environment written as `module:Class` (the class follows `environments.base.Environment`)."""


class CalculatorOptions(SpecModel):
    answer_reward: str | None = Field(
        default=None, description="Score the final answer with this reward type (default: exact number)"
    )
    max_calls_per_turn: int = Field(default=4, ge=1, le=32)


class GuessingGameOptions(SpecModel):
    max_number: PositiveInt = Field(default=100, description="The number is in 1..maxNumber")
    turn_penalty: float = Field(default=0.1, ge=0, le=1)
    min_reward: float = Field(default=0.1, ge=0, le=1)


class PythonToolOptions(SpecModel):
    answer_reward: str | None = Field(
        default=None, description="Score the final answer with this reward type (default: exact number)"
    )
    timeout_s: float = Field(default=5.0, gt=0, le=120, description="Wall-clock limit of one program")
    cpu_time_s: int = Field(default=3, ge=1, le=120)
    memory_mb: int = Field(default=512, ge=32, le=16384)
    max_output_chars: int = Field(default=2000, ge=16, le=100_000)


class VerifiersOptions(SpecModel):
    taskset: str = Field(min_length=1, description="A verifiers taskset id, or a class as module:Class")
    taskset_config: dict[str, Any] = Field(default_factory=dict, description="The taskset's config fields")
    env: str = Field(default="", description="A verifiers env id or module:Class; empty: the taskset's own")
    env_config: dict[str, Any] = Field(default_factory=dict, description="The env's config fields")
    max_tasks: int = Field(default=100_000, ge=1, description="Tasks indexed (an infinite taskset's first N)")
    reply_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for the env's answer")


ENVIRONMENT_OPTIONS: dict[str, type[BaseModel] | None] = {
    "calculator": CalculatorOptions,
    "guessing_game": GuessingGameOptions,
    "python_tool": PythonToolOptions,
    "verifiers": VerifiersOptions,
}
"""Each built-in environment and its `Options` model (None: it takes no options); the class registered
under the name must carry this very model."""

BUILTIN_ENVIRONMENTS: tuple[str, ...] = tuple(ENVIRONMENT_OPTIONS)


def is_known_environment(name: str) -> bool:
    return name in BUILTIN_ENVIRONMENTS or bool(CLASS_PATTERN.match(name))


class EnvironmentOptionsError(ValueError):
    """Options an environment refused; `field` is the option's path below `data.environment.options`."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


def validate_options(
    name: str, model: type[BaseModel] | None, options: Mapping[str, Any]
) -> BaseModel | None:
    """`options` validated against the environment's `Options` model (None: it takes none);
    EnvironmentOptionsError naming the first option refused."""
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
