"""`guessing_game`: find a hidden number in 1..N from higher/lower feedback; fewer guesses earn more.

The hidden number is the record's reference when it is a whole number in range, else drawn from the
episode's seed (so a re-dispatched episode hides the same number). Each turn's guess is the last whole
number it writes; the feedback (`higher` / `lower`) comes back as a user message. Found on guess k, the
reward is `max(minReward, 1 - turnPenalty * (k - 1))`; never found (the turn limit ends the game), 0.
"""

from __future__ import annotations

import random
import re
from typing import ClassVar

from decentralized_verl.environments.base import EpisodeRecord, StepInfo, StepResult
from decentralized_verl.spec.catalogue.environments import GuessingGameOptions

_WHOLE = re.compile(r"-?\d+")


class GuessingGame:
    """Higher/lower feedback until the hidden number is guessed."""

    Options = GuessingGameOptions
    instructions: ClassVar[str] = (
        "Guess the hidden whole number. Reply with one number per turn; you will be told whether the "
        "number is higher or lower than your guess."
    )

    def __init__(self, options: GuessingGameOptions | None = None) -> None:
        self.options = options or GuessingGameOptions()
        self.hidden = 0
        self.guesses = 0

    def reset(self, record: EpisodeRecord) -> None:
        top = self.options.max_number
        given = record.ground_truth.strip()
        if given.isdigit() and 1 <= int(given) <= top:
            self.hidden = int(given)
        else:
            self.hidden = random.Random(record.seed).randint(1, top)
        self.guesses = 0

    def step(self, turn: str) -> StepResult:
        numbers = _WHOLE.findall(turn)
        if not numbers:
            return StepResult(
                f"Reply with a whole number between 1 and {self.options.max_number}.",
                role="user",
                info=StepInfo(reason="no guess"),
            )
        self.guesses += 1
        guess = int(numbers[-1])
        if guess == self.hidden:
            reward = max(self.options.min_reward, 1.0 - self.options.turn_penalty * (self.guesses - 1))
            return StepResult(
                None, reward, done=True, info=StepInfo(reason=f"guessed in {self.guesses}"), role="user"
            )
        hint = "higher" if self.hidden > guess else "lower"
        return StepResult(f"{guess} is wrong: the number is {hint}.", role="user", info=StepInfo(reason=hint))
