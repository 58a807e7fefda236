"""What every spec section shares: camelCase aliases, unknown fields refused, and name-valued fields whose
allowed names come from the catalogue (the CRD lists them as an `enum` and `dverl validate` checks them)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from decentralized_verl.errors import Problem

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]


class CrossFieldProblems(ValueError):
    """Raised by a model validator to report several problems, each with its own path."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class SpecModel(BaseModel):
    """Base of every spec section: camelCase aliases, unknown fields forbidden, names accepted too, and
    strict types as the CRD states them: no "0.001" for a number, no 1e9 for an integer, no 1 for a bool.

    A field's docstring (the string under it) is its description, so `kubectl explain` shows it; a
    test fails on any CRD property without one."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_attribute_docstrings=True,
        strict=True,
    )


def one_of(names: Sequence[str]) -> str:
    """`a, b or c`."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class RegisteredName:
    """Marks a string field whose value must be a name the catalogue lists (or match `pattern`).

    The check is a cross-field rule (`rules.name_problems`), not a type error, so a wrong name is
    reported together with every other problem of the manifest.
    """

    kind: str
    names: tuple[str, ...]
    pattern: str | None = None
    """Also accept values matching this regex (a user callable as `module:function`)."""
    alternative: str = ""
    """How `pattern` is described in an error (`or a callable as module:function`)."""

    def problem(self, value: str) -> str | None:
        if value in self.names or (self.pattern is not None and re.match(self.pattern, value)):
            return None
        if self.pattern is not None:
            return f"unknown {self.kind} {value!r}; expected {', '.join(self.names)} {self.alternative}"
        return f"unknown {self.kind} {value!r}; expected {one_of(self.names)}"

    def json_schema(self) -> dict[str, Any]:
        """An `enum` of the names (so `kubectl explain` lists them); with a `pattern`, one regex that
        accepts the names or the pattern (a structural schema allows no `anyOf` of the two)."""
        if self.pattern is None:
            return {"type": "string", "enum": list(self.names)}
        names = "|".join(re.escape(n) for n in self.names)
        return {"type": "string", "pattern": f"^(?:{names}|{self.pattern.strip('^$')})$"}


def registered_name(
    kind: str, names: Sequence[str], pattern: str | None = None, alternative: str = ""
) -> Any:
    """A string type for a name the catalogue lists; see `RegisteredName`."""
    choice = RegisteredName(kind, tuple(names), pattern, alternative)
    return Annotated[str, choice, WithJsonSchema(choice.json_schema())]
