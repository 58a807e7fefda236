"""Shipped environments: the arithmetic evaluator, calculator, guessing game and sandboxed Python tool
(real child processes, hostile programs included), the registry and the spec's `data.environment`.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from decentralized_verl.environments.arithmetic import NotArithmetic, evaluate
from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.registry import environment_class, make_environment
from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.catalogue.environments import EnvironmentOptionsError
from decentralized_verl.spec.manifest import parse_job
from tests.support.job_manifests import environment_job

RECORD = EpisodeRecord("p0", "84", seed=7)


def test_arithmetic_is_exact() -> None:
    assert evaluate("12*7") == 84
    assert evaluate("1/3*3") == 1
    assert evaluate("(2+3)**2 - 7 // 2 % 2") == 24
    assert evaluate("-2^3") == -8
    assert evaluate("0.1+0.2") == Fraction(3, 10)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('id')", "Call"),
        ("x + 1", "Name"),
        ("(1).real", "Attribute"),
        ("[1, 2][0]", "Subscript"),
        ("9**9**9", "exponent"),
        ("10**40", "larger"),
        ("1/0", "division by zero"),
        ("1+" * 150 + "1", "longer"),
        ("'a' * 3", "only numbers"),
        ("lambda: 1", "Lambda"),
    ],
)
def test_arithmetic_refuses_everything_else(expression: str, why: str) -> None:
    started = time.perf_counter()
    with pytest.raises(NotArithmetic, match=why):
        evaluate(expression)
    assert time.perf_counter() - started < 0.5  # refused, not computed


def test_calculator_answers_calls_and_scores_the_final_answer() -> None:
    env = make_environment("calculator")
    env.reset(RECORD)
    step = env.step("first <calc>12*7</calc> then <calc>2**</calc>")
    assert not step.done and step.reward is None and step.role == "tool"
    assert step.observation.splitlines()[0] == "12*7 = 84"
    assert "error" in step.observation.splitlines()[1]
    assert (step.info.tool_calls, step.info.tool_errors) == (2, 1)
    final = env.step("So the answer is \\boxed{84}.")
    assert final.done and final.reward == 1.0 and final.observation is None
    wrong = make_environment("calculator")
    wrong.reset(RECORD)
    assert wrong.step("it is 85").reward == 0.0


def test_guessing_game_gives_feedback_and_rewards_fewer_turns() -> None:
    env = make_environment("guessing_game", {"maxNumber": 10, "turnPenalty": 0.25})
    env.reset(EpisodeRecord("p", "6", seed=1))
    assert "higher" in env.step("I guess 3").observation
    assert "lower" in env.step("9").observation
    assert "whole number" in env.step("no idea").observation  # not counted as a guess
    done = env.step("6")
    assert done.done and done.reward == pytest.approx(1 - 0.25 * 2)
    quick = make_environment("guessing_game", {"maxNumber": 10})
    quick.reset(EpisodeRecord("p", "6", seed=1))
    assert quick.step("6").reward == 1.0


def test_guessing_game_draws_the_number_from_the_seed_without_a_reference() -> None:
    hidden = []
    for _ in range(2):
        env = make_environment("guessing_game", {"maxNumber": 1000})
        env.reset(EpisodeRecord("p", "", seed=12345))
        hidden.append(env.hidden)
    other = make_environment("guessing_game", {"maxNumber": 1000})
    other.reset(EpisodeRecord("p", "", seed=54321))
    assert hidden[0] == hidden[1] and 1 <= hidden[0] <= 1000
    assert other.hidden != hidden[0]


def test_unknown_environment_and_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        make_environment("chess")
    with pytest.raises(EnvironmentOptionsError) as info:
        make_environment("guessing_game", {"maxNumbr": 10})
    assert info.value.field == "maxNumbr"
    with pytest.raises(EnvironmentOptionsError) as info:
        make_environment("python_tool", {"timeoutS": -1})
    assert info.value.field == "timeoutS"


def test_a_user_environment_is_named_module_colon_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_envs.py").write_text(
        "from decentralized_verl.environments import StepResult\n"
        "class Echo:\n"
        "    instructions = 'Say anything.'\n"
        "    def reset(self, record):\n"
        "        self.n = 0\n"
        "    def step(self, turn):\n"
        "        self.n += 1\n"
        "        return StepResult(turn.upper(), reward=0.5, done=self.n == 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_environment("my_envs:Echo")
    env.reset(RECORD)
    assert env.step("hi").observation == "HI"
    assert env.step("bye").done
    with pytest.raises(EnvironmentOptionsError, match="takes no options"):
        make_environment("my_envs:Echo", {"x": 1})
    environment_class.cache_clear()
    sys.modules.pop("my_envs", None)


def test_spec_takes_an_environment_and_names_every_bad_field() -> None:
    guessing = {"name": "guessing_game", "maxTurns": 6, "options": {"maxNumber": 20}}
    spec = parse_job(environment_job(guessing)).spec
    assert spec.data.environment.max_turns == 6 and spec.data.environment.options == {"maxNumber": 20}
    with pytest.raises(ManifestError) as info:
        parse_job(environment_job({"name": "chess"}))
    assert any(p.path == "spec.data.environment.name" for p in info.value.problems)
    with pytest.raises(ManifestError) as info:
        parse_job(environment_job({"name": "guessing_game", "options": {"maxNumbr": 20}}))
    assert [p.path for p in info.value.problems] == ["spec.data.environment.options.maxNumbr"]
    with pytest.raises(ManifestError) as info:
        parse_job(environment_job({"name": "calculator", "maxTurns": 0, "onToolError": "ignore"}))
    paths = {p.path for p in info.value.problems}
    assert {"spec.data.environment.maxTurns", "spec.data.environment.onToolError"} <= paths


def test_an_environment_job_refuses_a_critic() -> None:
    doc = environment_job({"name": "calculator"})
    doc["spec"]["algorithm"] = {"name": "ppo", "samplesPerPrompt": 1}
    doc["spec"]["roles"]["critic"] = {"replicas": 0}
    with pytest.raises(ManifestError) as info:
        parse_job(doc)
    assert any(p.path == "spec.data.environment" and "critic" in p.message for p in info.value.problems)


def test_crd_lists_the_environments() -> None:
    from decentralized_verl.spec.crd import custom_resource_definition

    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    env = schema["properties"]["spec"]["properties"]["data"]["properties"]["environment"]
    assert all(name in env["properties"]["name"]["pattern"] for name in ("calculator", "guessing_game"))
    assert env["properties"]["options"]["x-kubernetes-preserve-unknown-fields"] is True
