"""User callables (`module:function`), the registry, batch dispatch and the torch-free import.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from decentralized_verl.rewards import REWARD_TYPES, RewardResult, score, score_batch
from decentralized_verl.rewards.result import is_reward_error
from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES, is_known_reward_type


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A throwaway module of user reward functions, uniquely named per test (imports are cached)."""
    name = "user_rewards_" + re.sub(r"\W", "_", request.node.name)  # a parameter's id may hold any text
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import math
            CALLS = []

            def length(completion, reference, prompt=None):
                CALLS.append(prompt)
                return len(completion) / 10

            def rich(completion, reference, **options):
                return RewardResultLike(options.get("bonus", 0.0))

            def explode(completion, reference):
                raise RuntimeError("boom")

            def nan(completion, reference):
                return math.nan

            def text(completion, reference):
                return "high"

            def exact(completion, reference):
                from decentralized_verl.rewards import RewardResult
                return RewardResult(float(completion == reference), "exact match")

            class RewardResultLike(float):
                pass

            not_callable = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_registry_matches_names() -> None:
    expected = {"boxed", "think_answer_tags", "code", "reward_model"}
    assert set(REWARD_TYPES) == set(BUILTIN_REWARD_TYPES) == expected
    assert is_known_reward_type("boxed")
    assert is_known_reward_type("my_pkg.rewards:score_fn")
    assert not is_known_reward_type("boxd")
    assert not is_known_reward_type("my_pkg.rewards")
    assert not is_known_reward_type("a:b:c")


def test_user_callable_float(user_module: str) -> None:
    result = score(f"{user_module}:length", "abcde", None, prompt="P")
    assert result.score == 0.5
    module = sys.modules[user_module]
    assert module.CALLS == ["P"]
    # imported once and cached: the same module object serves later calls
    score(f"{user_module}:length", "ab", None)
    assert sys.modules[user_module] is module and module.CALLS == ["P", None]


def test_user_callable_options_and_result(user_module: str) -> None:
    assert score(f"{user_module}:rich", "x", None, bonus=2.5).score == 2.5
    assert score(f"{user_module}:exact", "4", "4") == RewardResult(1.0, "exact match")


@pytest.mark.parametrize(
    ("function", "why"),
    [
        ("explode", "raised RuntimeError: boom"),
        ("nan", "non-finite"),
        ("text", "expected float or RewardResult"),
        ("missing", "has no callable missing"),
        ("not_callable", "has no callable not_callable"),
    ],
)
def test_user_callable_failures_score_zero(user_module: str, function: str, why: str) -> None:
    result = score(f"{user_module}:{function}", "x", None)
    assert result.score == 0.0
    assert why in result.reason
    assert is_reward_error(result.reason)  # counted apart from a wrong answer, which is no error


def test_a_raising_reward_keeps_its_traceback_for_the_workers_log(user_module: str) -> None:
    result = score(f"{user_module}:explode", "x", None)
    assert result.reason == f"reward error: {user_module}:explode raised RuntimeError: boom"
    assert 'raise RuntimeError("boom")' in result.details["traceback"]


def test_a_wrong_answer_is_not_a_reward_error(user_module: str) -> None:
    assert not is_reward_error(score(f"{user_module}:exact", "4", "5").reason)
    assert not is_reward_error(score("boxed", "no box here", "2").reason)
    assert not is_reward_error(None) and not is_reward_error("")


def test_unknown_types_and_modules_score_zero() -> None:
    assert "cannot import" in score("no_such_module_xyz:f", "x", None).reason
    assert score("nonsense", "x", None).reason == "unknown reward type 'nonsense'"


def test_score_batch_lengths_and_prompts(user_module: str) -> None:
    results = score_batch(f"{user_module}:length", ["a", "abc"], [None, None], prompts=["p1", "p2"])
    assert [r.score for r in results] == [0.1, pytest.approx(0.3)]
    mismatch = score_batch("boxed", ["a", "b"], ["1"])
    assert all(r.score == 0.0 and "batch lengths differ" in r.reason for r in mismatch)
    math_batch = score_batch("boxed", ["\\boxed{2}", "\\boxed{3}", None], ["2", "2", "2"], workers=2)
    assert [r.score for r in math_batch] == [1.0, 0.0, 0.0]
