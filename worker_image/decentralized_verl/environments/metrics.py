"""Step metrics of multi-turn episodes: turns, tool use and how episodes ended (empty for single-turn)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def episode_metrics(samples: Sequence[Any]) -> dict[str, float]:
    """Means over a step's episodes (samples with turns): `turns_mean`, `tool_calls_mean`,
    `tool_errors_mean`, `episode_reward_mean` (the rollout side's environment; `reward_mean` is the trusted
    replay's), `model_token_frac` (share of response tokens the policy generated) and
    `ended_<reason>_frac` per kind of end."""
    episodes = [s for s in samples if s.turns]
    if not episodes:
        return {}

    def mean(key: str) -> float:
        return statistics.fmean(float(s.extra.get(key, 0.0)) for s in episodes)

    tokens = sum(len(s.response_ids) for s in episodes)
    model_tokens = sum(sum(s.loss_mask) if s.loss_mask is not None else len(s.response_ids) for s in episodes)
    out = {
        "turns_mean": statistics.fmean(len(s.turns) for s in episodes),
        "tool_calls_mean": mean("tool_calls"),
        "tool_errors_mean": mean("tool_errors"),
        "episode_reward_mean": mean("episode_reward"),
        "model_token_frac": model_tokens / max(tokens, 1),
    }
    reasons: dict[str, int] = {}
    for s in episodes:
        family = _family(s.end_reason)
        reasons[family] = reasons.get(family, 0) + 1
    for reason, count in sorted(reasons.items()):
        out[f"ended_{reason}_frac"] = count / len(episodes)
    return out


def _family(reason: str) -> str:
    """`answered: correct` and `guessed in 3` count as `answered` and `guessed` (one metric per kind)."""
    word = reason.split(":")[0].split(" ")[0].strip().lower()
    return "".join(c if c.isalnum() or c == "_" else "_" for c in word) or "unknown"
