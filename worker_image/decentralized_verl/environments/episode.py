"""One episode's token bookkeeping: the model's turns and the environment's observations, one sequence.

The sequence after the prompt is built by appending, never re-tokenizing: each model turn's tokens exactly
as sampled (loss mask 1, with their log-probs), then the observation's tokens as the chat template frames
them (loss mask 0, log-prob 0.0), then the next turn. The learner trains on that sequence with that mask,
so it computes log-probs of exactly the tokens the policy sampled, in exactly the context it saw.

Pure and synchronous: generation and environment steps are done by the caller (`rollout.py`), which hands
their results to `record_turn` and `record_step`. Limits: `maxTurns` model turns; a token budget for
everything after the prompt (`maxTotalTokens` and the model's context); each turn at most the job's
`maxNewTokens`; observations cut to `maxObservationTokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from decentralized_verl.environments.base import Environment, StepResult
from decentralized_verl.environments.turns import TurnFormat

EndReason = str
"""Why an episode ended: the environment's `done` reason, `max_turns`, `token_budget`, `tool_error`,
`tool_timeout` or `environment_error` (reset failed)."""

CUT_MARK = " [...]"


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_total_tokens: int | None = None
    """Tokens after the prompt, model and environment together (None: only the context limits)."""
    max_observation_tokens: int = 256
    context_tokens: int | None = None
    """The model's context: prompt + everything after it must fit."""
    on_tool_error: Literal["observe", "end"] = "observe"

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens_per_turn", "max_observation_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EpisodeLimits.{name}: must be >= 1 (got {getattr(self, name)})")


@dataclass(frozen=True)
class TurnOutput:
    """What generation gave for one turn."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]
    text: str


@dataclass(frozen=True)
class StepFailure:
    """A step that raised or did not answer in time."""

    kind: Literal["tool_error", "tool_timeout"]
    message: str


@dataclass(frozen=True)
class EpisodeResult:
    """A finished episode: the response sequence with its loss mask and log-probs, and what happened."""

    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turns: tuple[str, ...]
    """Each model turn's text, as generated (what the environment was shown)."""
    turn_rewards: tuple[float, ...]
    reward: float
    reason: EndReason
    finish_reason: Literal["stop", "length"]
    tool_calls: int
    tool_errors: int

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Episode:
    """A running episode (see the module docstring); `encode`/`decode_token` come from the tokenizer."""

    prompt_ids: tuple[int, ...]
    env: Environment
    fmt: TurnFormat
    limits: EpisodeLimits
    encode: Callable[[str], list[int]]
    decode_token: Callable[[int], str]
    """A token's text with special tokens kept (to see whether a turn ended on the template's closer)."""
    eos_token_ids: frozenset[int] = frozenset()
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    reason: EndReason | None = None
    _last_tail: str = ""

    @property
    def done(self) -> bool:
        return self.reason is not None

    def end(self, reason: EndReason) -> None:
        if self.reason is None:
            self.reason = reason

    def budget(self) -> int | None:
        """Tokens that may still follow the current sequence (None: no limit but the turns')."""
        left = []
        if self.limits.max_total_tokens is not None:
            left.append(self.limits.max_total_tokens - len(self.response_ids))
        if self.limits.context_tokens is not None:
            left.append(self.limits.context_tokens - len(self.prompt_ids) - len(self.response_ids))
        return min(left) if left else None

    def next_turn(self) -> tuple[tuple[int, ...], int] | None:
        """(context token ids, max new tokens) of the next model turn, or None when the episode is over."""
        if self.done:
            return None
        if len(self.turns) >= self.limits.max_turns:
            self.end("max_turns")
            return None
        budget = self.budget()
        room = (
            self.limits.max_tokens_per_turn
            if budget is None
            else min(self.limits.max_tokens_per_turn, budget)
        )
        if room < 1:
            self.end("token_budget")
            return None
        return (*self.prompt_ids, *self.response_ids), room

    def record_turn(self, out: TurnOutput) -> str:
        """Append the model's turn; returns the text the environment is to step on."""
        if len(out.logprobs) != len(out.token_ids):
            raise ValueError(
                f"turn {len(self.turns)}: {len(out.logprobs)} log-probs for {len(out.token_ids)} tokens"
            )
        self.response_ids.extend(out.token_ids)
        self.loss_mask.extend([1] * len(out.token_ids))
        self.logprobs.extend(out.logprobs)
        self.turns.append(out.text)
        last = out.token_ids[-1] if out.token_ids else None
        self._last_tail = self.decode_token(last) if last is not None and last in self.eos_token_ids else ""
        return out.text

    def record_step(self, outcome: StepResult | StepFailure) -> None:
        """Take the environment's answer to the last turn: rewards, counters, the observation's tokens."""
        if isinstance(outcome, StepFailure):
            self.tool_errors += 1
            self.turn_rewards.append(0.0)
            if self.limits.on_tool_error == "end":
                self.end(outcome.kind)
                return
            outcome = StepResult(f"error: {outcome.message}")
        else:
            self.tool_calls += outcome.info.tool_calls
            self.tool_errors += outcome.info.tool_errors
            self.turn_rewards.append(float(outcome.reward or 0.0))
        if outcome.done:
            self.end(outcome.info.reason or "done")
            return
        if len(self.turns) >= self.limits.max_turns:
            self.end("max_turns")  # an observation nobody answers is not worth its tokens
            return
        text = self.fmt.between_turns(self._cut(outcome.observation or ""), outcome.role, self._last_tail)
        ids = self.encode(text)
        budget = self.budget()
        if budget is not None and len(ids) + 1 > budget:  # no room for it and one more model token
            self.end("token_budget")
            return
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def _cut(self, observation: str) -> str:
        ids = self.encode(observation)
        if len(ids) <= self.limits.max_observation_tokens:
            return observation
        keep = self.limits.max_observation_tokens - len(self.encode(CUT_MARK))
        return _prefix_within(observation, max(keep, 0), self.encode) + CUT_MARK

    def result(self) -> EpisodeResult:
        assert self.reason is not None, "the episode is still running"
        return EpisodeResult(
            response_ids=tuple(self.response_ids),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            turns=tuple(self.turns),
            turn_rewards=tuple(self.turn_rewards),
            reward=sum(self.turn_rewards),
            reason=self.reason,
            finish_reason="length" if self.reason == "token_budget" else "stop",
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
        )


def _prefix_within(text: str, keep: int, encode: Callable[[str], list[int]]) -> str:
    """The longest prefix of `text` that encodes to at most `keep` tokens (binary search on characters)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if len(encode(text[:middle])) <= keep:
            low = middle
        else:
            high = middle - 1
    return text[:low]
