"""Scoring an episode on the trusted side: play its environment again on the model's turns.

A rollout worker (a volunteer, perhaps) reports the turns its model wrote; the reward worker resets a fresh
environment on the same record and seed, steps it on each turn, and sums the step rewards. Nothing the
worker claims about observations or rewards is used, and a transcript the environment would not have
allowed (more turns than `maxTurns`, turns after the episode ended) scores 0. Environments are expected
to be deterministic given the record and the turns (the built-ins are, except for programs that read the
clock or draw unseeded random numbers).

The transcript travels as the score item's completion text (`transcript` / `parse_transcript`) under the
reserved reward type `environment`, so the reward wire needs no new message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.episode import StepFailure
from decentralized_verl.environments.registry import make_environment
from decentralized_verl.environments.rollout import record_seed
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.environments.stepping import Stepper
from decentralized_verl.rewards.result import RewardResult, zero

ENVIRONMENT_REWARD = "environment"
"""The reward type the coordinator asks for when the job has an environment: the episode's own reward."""

MAX_TRANSCRIPT_CHARS = 4_000_000


@dataclass(frozen=True)
class Transcript:
    prompt_id: str
    turns: tuple[str, ...]


def transcript(prompt_id: str, turns: Sequence[str]) -> str:
    """The completion text that carries an episode to a reward worker."""
    return json.dumps({"prompt_id": prompt_id, "turns": list(turns)})


def parse_transcript(text: str) -> Transcript:
    """The episode a completion text carries; ValueError naming what is malformed."""
    if len(text) > MAX_TRANSCRIPT_CHARS:
        raise ValueError(f"transcript longer than {MAX_TRANSCRIPT_CHARS} characters")
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("transcript is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("transcript must be an object with prompt_id and turns")
    prompt_id, turns = data.get("prompt_id"), data.get("turns")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise ValueError("transcript.prompt_id must be a non-empty string")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError("transcript.turns must be a non-empty list of strings")
    return Transcript(prompt_id, tuple(turns))


def replay(
    settings: EpisodeSettings,
    turns: Sequence[str],
    *,
    prompt_id: str,
    ground_truth: str,
    prompt_text: str = "",
) -> RewardResult:
    """The episode's reward from a fresh environment stepped on `turns`; never raises."""
    if len(turns) > settings.max_turns:
        return zero(f"{len(turns)} turns, more than maxTurns {settings.max_turns}")
    try:
        env = make_environment(settings.name, settings.options, timeout_s=settings.step_timeout_s)
    except Exception as exc:
        return zero(f"environment {settings.name!r} unavailable: {exc}"[:300])
    stepper = Stepper(settings.step_timeout_s)
    record = EpisodeRecord(prompt_id, ground_truth, record_seed(prompt_id), prompt_text)
    failed = stepper.reset([env], [record])[0]
    if failed is not None:
        return zero(f"environment_error: {failed.message}"[:300])
    total, calls, errors = 0.0, 0, 0
    for k, turn in enumerate(turns):
        outcome = stepper.step([env], [turn])[0]
        if isinstance(outcome, StepFailure):
            errors += 1
            if settings.on_tool_error == "end":
                return RewardResult(total, outcome.kind, _details(k + 1, calls, errors))
            continue
        calls += outcome.info.tool_calls
        errors += outcome.info.tool_errors
        total += float(outcome.reward or 0.0)
        if outcome.done:
            if k != len(turns) - 1:
                return zero(f"{len(turns) - k - 1} turns after the episode ended at turn {k + 1}")
            return RewardResult(total, outcome.info.reason or "done", _details(k + 1, calls, errors))
    reason = "max_turns" if len(turns) == settings.max_turns else "unfinished"
    return RewardResult(total, reason, _details(len(turns), calls, errors))


def _details(turns: int, tool_calls: int, tool_errors: int) -> dict[str, int]:
    return {"turns": turns, "tool_calls": tool_calls, "tool_errors": tool_errors}
