"""User environments (`module:Class`) run apart from the secrets of the process that plays them.

In a process handed secrets, a user environment lives in a child like user rewards: its episodes play
the same as in-process, its options and preflight are checked there, its prints cannot forge a reply, and
a call that misses its deadline has the child restarted. Against a live reward worker started the way
`dverl run` starts it, a user environment that tries to steal finds no token, key or seed
(`test_secrets_neighbours.py`, whose worker's job has that environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from decentralized_verl.environments import apart, registry
from decentralized_verl.environments.base import EpisodeRecord, StepResult
from decentralized_verl.spec import TinyModelSpec

SPY = "tests.support.spy_environment:Spy"
TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=256)
GAME = """
import time
from decentralized_verl.environments.base import StepResult


class Counter:
    instructions = "Count."

    def reset(self, record):
        self.n = int(record.ground_truth)

    def step(self, turn):
        if turn == "hang":
            time.sleep(30)
        print("noise on stdout")
        self.n += 1
        return StepResult(observation=f"n={self.n}", reward=0.5, done=self.n >= 3)
"""


@pytest.fixture
def apart_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    (tmp_path / "user_game.py").write_text(GAME)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(apart, "_apart", True)
    yield
    apart._child.close()


def test_a_user_environment_plays_in_a_child_the_same_game(apart_mode: None) -> None:
    env = registry.make_environment("user_game:Counter", timeout_s=10)
    assert isinstance(env, apart.ApartEnvironment)
    env.reset(EpisodeRecord("p", "1", 0))
    assert env.step("a") == StepResult(observation="n=2", reward=0.5, done=False)
    assert env.step("b") == StepResult(observation="n=3", reward=0.5, done=True)
    assert registry.instructions("user_game:Counter") == "Count."
    assert apart._child._proc is not None and apart._child._proc.pid != os.getpid()
    # Shipped environments stay in-process.
    assert not isinstance(registry.make_environment("calculator"), apart.ApartEnvironment)


def test_a_user_environments_problems_are_named_and_a_hung_step_restarts_the_child(apart_mode: None) -> None:
    with pytest.raises(ValueError, match="no_such_module"):
        registry.preflight("no_such_module:Game")
    with pytest.raises(ValueError, match="surprise"):
        registry.preflight(SPY, {"report": "/dev/null", "surprise": 1})
    env = registry.make_environment("user_game:Counter", timeout_s=2)
    env.reset(EpisodeRecord("p", "0", 0))
    with pytest.raises(apart.ChildFailed, match="no answer within 2s"):
        env.step("hang")
    with pytest.raises(apart.ChildFailed, match="restarted"):
        env.step("a")  # its episode's state went with the child
    fresh = registry.make_environment("user_game:Counter", timeout_s=10)
    fresh.reset(EpisodeRecord("p", "2", 0))
    assert fresh.step("a").done


def test_a_rollout_worker_plays_the_same_episodes_through_the_child(
    policy, apart_mode: None, tmp_path: Path
) -> None:
    """The guessing game as a user's `module:Class` in a child, played by a tiny policy through a rollout
    worker (episodes stepped concurrently by the worker, one at a time by the child): the same samples,
    turn for turn and token for token, as the built-in played in-process."""
    from dataclasses import replace

    from tests.support.multiturn import GAME, play, prompts

    (tmp_path / "user_guess.py").write_text(
        "from decentralized_verl.environments.guessing_game import GuessingGame as Game\n"
    )
    model, tok = policy
    items = [(p, k) for p in prompts(tok) for k in range(2)]
    built_in = play(model, tok, items)
    child = play(model, tok, items, settings=replace(GAME, name="user_guess:Game"))
    assert apart._child._proc is not None  # the user's class ran there
    assert any(len(s.turns) > 1 for s in built_in.values())
    for key, sample in built_in.items():
        other = child[key]
        assert other.turns == sample.turns and other.response_ids == sample.response_ids
        assert other.loss_mask == sample.loss_mask

        def untimed(extra: dict) -> dict:
            return {k: v for k, v in extra.items() if not k.endswith("seconds")}

        assert untimed(other.extra) == untimed(sample.extra)
