"""A guessing game written with verifiers' own classes, for the shipped example and the tests (no network).

`GuessingTaskset` yields one task per hidden number (the task's data holds it); `GuessingEnv.run` plays
it as verifiers multi-turn envs do, through `agents.player.interaction(task)`: each reply is a guess, a
wrong one is answered "higher" or "lower", a right one ends the game (`trace.info["found_on"]`); the
task's `@vf.reward` scores 1.0 for a first-guess hit, `turn_penalty` less per extra guess. Named in a
spec as `taskset: decentralized_verl.environments.verifiers_guessing:GuessingTaskset` (the env is found
through `__all__`, as verifiers finds a taskset package's env). Importing it needs verifiers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["GuessingEnv", "GuessingTaskset"]

_NUMBER = re.compile(r"-?\d+")


class GuessingConfig(vf.TasksetConfig):
    max_number: int = 4
    tasks: int = 64
    seed: int = 0
    turn_penalty: float = 0.2


class GuessingData(vf.TaskData):
    answer: int
    turn_penalty: float = 0.2


class GuessingTask(vf.Task[GuessingData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, task: GuessingData, trace: vf.Trace) -> float:
        guesses = trace.info.get("found_on")
        return 0.0 if guesses is None else max(0.0, 1.0 - task.turn_penalty * (guesses - 1))


class GuessingTaskset(vf.Taskset[GuessingTask, GuessingConfig]):
    def load(self) -> Iterator[GuessingTask]:
        rng = random.Random(self.config.seed)
        top = self.config.max_number
        for i in range(self.config.tasks):
            yield GuessingTask(
                GuessingData(
                    name=f"guess-{i}",
                    prompt="Guess the number.",
                    system_prompt=f"Guess 1-{top}.",
                    answer=rng.randint(1, top),
                    turn_penalty=self.config.turn_penalty,
                ),
                self.config.task,
            )


class GuessingEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessingEnv(vf.Env[GuessingEnvConfig]):
    async def run(self, task: GuessingTask, agents: vf.Agents) -> None:
        async with agents.player.interaction(task) as exchange:
            segment = await exchange.turn()
            guesses = 0
            while not segment.terminated:
                guesses += 1
                found = _NUMBER.search(segment.last_reply)
                guess = int(found.group()) if found else None
                if guess == task.data.answer:
                    exchange.trace.info["found_on"] = guesses
                    return
                hint = "higher" if guess is None or guess < task.data.answer else "lower"
                segment = await exchange.turn(f"No, the number is {hint}.")
