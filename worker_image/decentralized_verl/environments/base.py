"""What an environment is: the protocol every multi-turn environment implements, and the values it trades.

An episode alternates: the model writes a turn, the environment answers with an observation (a tool's
output, a game's feedback) or says the episode is over. The environment never sees tokens, only text;
the episode loop (`episode.py`) owns the token sequence, the loss mask and every limit (turns, tokens,
time). Rewards are earned per step; an episode's reward is the sum of its steps' rewards, so an episode
cut short (turn or token limit) keeps what it earned so far and an unfinished game earns nothing.

Pure: nothing here imports torch or transformers (the spec and the operator import the names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

ObservationRole = Literal["tool", "user"]
"""The chat role an observation is templated as: `tool` for a tool's output, `user` for feedback."""


@dataclass(frozen=True)
class EpisodeRecord:
    """What an environment knows of the data item it is played on."""

    prompt_id: str
    ground_truth: str
    """The record's reference answer (a hidden number, a result, code tests as JSON), "" when none."""
    seed: int
    """The episode's own seed (the same for a re-dispatched sample), for environments that draw."""
    prompt_text: str = ""


@dataclass(frozen=True)
class StepInfo:
    """What a step did, for metrics and logs."""

    tool_calls: int = 0
    tool_errors: int = 0
    reason: str = ""
    """Why the episode ended when `done` (`answered`, `guessed`, ...), else what happened."""


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one model turn.

    `observation` is the text sent back to the model (None: nothing to say, which only makes sense with
    `done`). `reward` is what this turn earned (None counts as 0). `done` ends the episode.
    """

    observation: str | None
    reward: float | None = None
    done: bool = False
    info: StepInfo = StepInfo()
    role: ObservationRole = "tool"


@runtime_checkable
class Environment(Protocol):
    """One episode's environment: a fresh instance per episode (it may keep state between steps).

    Implementations are plain classes registered by name (`registry.environment`) or named in the spec
    as `module:Class`; `Options`, when the class has it, is a pydantic model the spec's
    `data.environment.options` are validated against (unknown options are refused by name).
    """

    instructions: ClassVar[str]
    """How to use the environment, for the model: the system prompt when `data.systemPrompt` is unset."""

    def reset(self, record: EpisodeRecord) -> None:
        """Start an episode on `record` (before the model's first turn)."""
        ...

    def step(self, turn: str) -> StepResult:
        """Answer the model's turn `turn` (its decoded text, stop string included)."""
        ...


def describe(value: Any, limit: int = 80) -> str:
    """A short repr for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
