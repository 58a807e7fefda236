"""The normalised records every reader produces, whatever the file format or data set layout was.

Frozen dataclasses so a record read once can be shared by the sampler, the rollout requests and
the reward workers without anyone mutating it on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
"""The roles a data file's messages may have."""
DEMO_ROLES: tuple[str, ...] = (*ROLES, "tool")
"""The roles of few-shot demos: `tool` too, so a demo can show a tool call and its answer."""

# The layouts a file may hold; `kind` arguments and error messages use these names.
PROMPT_KINDS: tuple[str, ...] = ("math", "code", "prompt", "verl")
KINDS: tuple[str, ...] = (*PROMPT_KINDS, "sft", "preference")


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn, as tokenizers' chat templates expect it."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class CodeTests:
    """stdin -> expected stdout pairs (seed-004 / PRIME layout); equal lengths are checked on read."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class PromptRecord:
    """A prompt for RL: what the policy sees, plus what the reward needs to verify an answer.

    `ground_truth` is set for math / prompt-only-with-answer / veRL items, `tests` for code items;
    both may be None (a prompt scored by a reward model).
    """

    id: str
    messages: tuple[ChatMessage, ...]
    ground_truth: str | None = None
    tests: CodeTests | None = None
    data_source: str | None = None
    kind: str = "prompt"
    reward_style: str | None = None
    extra_info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class SFTRecord:
    """A supervised pair: the completion is learned, the prompt only conditions."""

    id: str
    prompt: str
    completion: str


@dataclass(frozen=True)
class PreferenceRecord:
    """A preference pair for Bradley-Terry reward-model training."""

    id: str
    prompt: str
    chosen: str
    rejected: str


Record = PromptRecord | SFTRecord | PreferenceRecord
