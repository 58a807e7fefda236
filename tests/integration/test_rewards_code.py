"""The `code` reward: partial credit over seed-004 test cases, malformed tests scored 0 with a reason."""

from __future__ import annotations

import json

import pytest

from decentralized_verl.rewards import SandboxLimits, score, score_batch
from decentralized_verl.rewards.code_reward import outputs_match

TESTS = {"inputs": ["1 2\n", "5 7\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "12\n", "7\n", "0\n"]}
LIMITS = SandboxLimits(wall_time_s=5.0, cpu_time_s=2)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def test_correct_program_scores_one() -> None:
    result = score("code", fenced("a, b = map(int, input().split())\nprint(a + b)"), TESTS, limits=LIMITS)
    assert (result.score, result.reason) == (1.0, "all tests passed")


def test_partially_correct_program_gets_fraction() -> None:
    # wrong whenever b is negative: passes 3 of 4
    code = "a, b = map(int, input().split())\nprint(a + abs(b))"
    result = score("code", fenced(code), TESTS, limits=LIMITS)
    assert result.score == pytest.approx(0.75)
    assert result.details is not None
    assert result.details["tests"] == ["passed", "passed", "wrong_output", "passed"]


def test_last_block_is_used_and_trailing_whitespace_ignored() -> None:
    right = "a, b = map(int, input().split())\nprint(a + b, '  ')\nprint()"
    completion = fenced("print('wrong')") + fenced(right)
    assert score("code", completion, TESTS, limits=LIMITS).score == 1.0


def test_crashing_and_looping_programs_fail_their_tests() -> None:
    code = (
        "a, b = map(int, input().split())\nif a == 5:\n    while True: pass\n"
        "if a == 10:\n    1/0\nprint(a + b)"
    )
    result = score("code", fenced(code), TESTS, limits=SandboxLimits(wall_time_s=3.0, cpu_time_s=1))
    assert result.score == pytest.approx(0.5)
    assert result.details["tests"][1] in {"cpu_limit", "timeout"}
    assert result.details["tests"][2] == "error"


def test_json_string_tests_and_parallel_runs_agree() -> None:
    code = fenced("a, b = map(int, input().split())\nprint(a * b if a > 1 else a + b)")
    serial = score("code", code, json.dumps(TESTS), limits=LIMITS)
    parallel = score("code", code, TESTS, limits=LIMITS, parallel=4)
    assert serial.score == parallel.score == pytest.approx(0.5)


def test_no_code_block_scores_zero() -> None:
    result = score("code", "print(1)", TESTS)
    assert (result.score, result.reason) == (0.0, "no ```python code block found")


@pytest.mark.parametrize(
    ("tests", "why"),
    [
        (None, "must be an object"),
        ("not json", "not valid JSON"),
        ({"inputs": ["1"]}, "outputs must be a list of strings"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
        ({"inputs": [1], "outputs": ["1"]}, "inputs must be a list of strings"),
        ({"inputs": "1", "outputs": "1"}, "inputs must be a list of strings"),
        ({"inputs": [], "outputs": []}, "no tests"),
        ([["1", "1"]], "must be an object"),
    ],
)
def test_malformed_tests_score_zero_with_reason(tests: object, why: str) -> None:
    result = score("code", fenced("print(1)"), tests)
    assert result.score == 0.0
    assert why in result.reason


def test_batch_scoring() -> None:
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    references = [TESTS, TESTS, {"bad": 1}]
    results = score_batch("code", [good, "no code", good], references, limits=LIMITS, workers=2)
    assert [r.score for r in results] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        ("1\n2\n", "1\n2", True),
        ("1  \n2\t\n\n\n", "1\n2\n", True),
        ("1\r\n2\r\n", "1\n2\n", True),
        ("1\n 2\n", "1\n2\n", False),
        ("1\n\n2\n", "1\n2\n", False),
        ("", "0\n", False),
    ],
)
def test_outputs_match(actual: str, expected: str, equal: bool) -> None:
    assert outputs_match(actual, expected) is equal
