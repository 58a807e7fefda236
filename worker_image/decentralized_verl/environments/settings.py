"""The settings of a job's episodes, from the spec's `data.environment`, for rollout and reward workers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.environments.episode import EpisodeLimits


@dataclass(frozen=True)
class EpisodeSettings:
    """Which environment and the limits of its episodes (the spec's `data.environment`)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_total_tokens: int | None = None
    max_observation_tokens: int = 256
    step_timeout_s: float = 30.0
    on_tool_error: str = "observe"

    @classmethod
    def from_spec(cls, spec: Any) -> EpisodeSettings:
        """From a `spec.data.EnvironmentSpec`."""
        return cls(
            name=spec.name,
            options=dict(spec.options),
            max_turns=spec.max_turns,
            max_total_tokens=spec.max_total_tokens,
            max_observation_tokens=spec.max_observation_tokens,
            step_timeout_s=spec.step_timeout_s,
            on_tool_error=spec.on_tool_error,
        )

    def limits(self, max_tokens_per_turn: int, context_tokens: int | None) -> EpisodeLimits:
        return EpisodeLimits(
            max_turns=self.max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_total_tokens=self.max_total_tokens,
            max_observation_tokens=self.max_observation_tokens,
            context_tokens=context_tokens,
            on_tool_error="end" if self.on_tool_error == "end" else "observe",
        )


def episode_settings(environment: Any) -> EpisodeSettings | None:
    """Settings from what a caller holds: none, the settings themselves, or the spec's `data.environment`."""
    if environment is None or isinstance(environment, EpisodeSettings):
        return environment
    return EpisodeSettings.from_spec(environment)
