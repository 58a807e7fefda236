"""Play a batch of episodes with one generation engine: every live episode's next turn in one batch.

Per round: each live episode asks for its next turn (context, token budget), the engine generates them
together, each turn is recorded, the environments step concurrently under the step timeout, and each
observation is appended. An episode is yielded as soon as it ends, so a rollout worker can stream it
while the others play on. Backend-agnostic: generation is any `GenerateTurns` function.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.episode import Episode, EpisodeResult, TurnOutput
from decentralized_verl.environments.registry import make_environment, preflight
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.environments.stepping import Stepper
from decentralized_verl.environments.turns import TurnFormat, turn_format


@dataclass(frozen=True)
class TurnRequest:
    """One turn to generate: episode `index`'s context and how many tokens it may add."""

    index: int
    turn: int
    context_ids: tuple[int, ...]
    max_new_tokens: int


GenerateTurns = Callable[[Sequence[TurnRequest]], Iterable[tuple[int, TurnOutput]]]
"""Generate every request's turn; yields (request index, output) in any order, each exactly once."""


def record_seed(prompt_id: str) -> int:
    """An environment's seed: one per prompt, so every sample of a group plays the same game and a replay on
    the trusted side (`replay.py`) plays it again."""
    return int.from_bytes(hashlib.sha256(f"env\x00{prompt_id}".encode()).digest()[:8], "big") >> 1


class EpisodeRunner:
    """Plays episodes of one environment with one tokenizer's chat template."""

    def __init__(
        self,
        settings: EpisodeSettings,
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int] = (),
        context_tokens: int | None = None,
        fmt: TurnFormat | None = None,
    ) -> None:
        preflight(settings.name, settings.options)  # a bad option or a missing package fails here
        self.settings = settings
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.context_tokens = context_tokens
        self.fmt = fmt or turn_format(tokenizer)
        self._make = lambda: make_environment(
            settings.name, settings.options, timeout_s=settings.step_timeout_s
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode_token(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def run(
        self,
        starts: Sequence[tuple[tuple[int, ...], EpisodeRecord]],
        generate: GenerateTurns,
        max_tokens_per_turn: int,
    ) -> Iterator[tuple[int, EpisodeResult]]:
        """Play one episode per (prompt ids, record); yields (index into `starts`, result) as each ends."""
        limits = self.settings.limits(max_tokens_per_turn, self.context_tokens)
        stepper = Stepper(self.settings.step_timeout_s)
        episodes = [
            Episode(
                prompt_ids=tuple(prompt_ids),
                env=self._make(),
                fmt=self.fmt,
                limits=limits,
                encode=self.encode,
                decode_token=self.decode_token,
                eos_token_ids=self.eos_token_ids,
            )
            for prompt_ids, _ in starts
        ]
        broken = stepper.reset([e.env for e in episodes], [record for _, record in starts])
        yielded: set[int] = set()
        while True:
            requests = []
            for i, episode in enumerate(episodes):
                turn = episode.next_turn()
                if turn is not None:
                    requests.append(TurnRequest(i, len(episode.turns), turn[0], turn[1]))
                elif i not in yielded:
                    yielded.add(i)
                    yield i, episode.result()
            if not requests:
                return
            texts = {i: episodes[i].record_turn(output) for i, output in generate(requests)}
            ready = [i for i in texts if broken[i] is None]
            outcomes = stepper.step([episodes[i].env for i in ready], [texts[i] for i in ready])
            for i, outcome in zip(ready, outcomes, strict=True):
                episodes[i].record_step(outcome)
            for i in texts:
                if broken[i] is not None:  # its reset failed: the first turn is all the episode gets
                    episodes[i].turn_rewards.append(0.0)
                    episodes[i].tool_errors += 1
                    episodes[i].end("environment_error")
                if episodes[i].done:
                    yielded.add(i)
                    yield i, episodes[i].result()
