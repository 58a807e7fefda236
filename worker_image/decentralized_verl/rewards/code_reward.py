"""The `code` reward: run the completion's last ```python block on each test case.

Test cases are `{"inputs": [str, ...], "outputs": [str, ...]}` (or that object as a JSON string):
stdin in, expected stdout out. Outputs compare line by line with trailing whitespace stripped and
trailing blank lines ignored. Score = fraction of tests passed (partial credit).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from decentralized_verl.rewards.extract import last_python_block
from decentralized_verl.rewards.result import RewardResult, zero
from decentralized_verl.rewards.sandbox import SandboxLimits, run_python


class MalformedTests(ValueError):
    """Test cases not in the `{"inputs": [str], "outputs": [str]}` shape; the message says what is wrong."""


def parse_tests(tests: Any) -> list[tuple[str, str]]:
    """(stdin, expected stdout) pairs, or MalformedTests naming the problem."""
    if isinstance(tests, str | bytes):
        try:
            tests = json.loads(tests)
        except ValueError as exc:
            raise MalformedTests(f"test cases are not valid JSON: {exc}") from None
    if not isinstance(tests, Mapping):
        raise MalformedTests(f"test cases must be an object with inputs/outputs, got {type(tests).__name__}")
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    for name, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise MalformedTests(f"test_cases.{name} must be a list of strings")
    assert isinstance(inputs, list) and isinstance(outputs, list)
    if len(inputs) != len(outputs):
        raise MalformedTests(f"test_cases has {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise MalformedTests("test_cases has no tests")
    return list(zip(inputs, outputs, strict=True))


def outputs_match(actual: str, expected: str) -> bool:
    """Equal after stripping trailing whitespace per line and trailing blank lines."""

    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(actual) == lines(expected)


def code_reward(
    completion: str,
    reference: Any,
    *,
    limits: SandboxLimits | None = None,
    max_tests: int | None = None,
    stop_on_first_failure: bool = False,
    parallel: int = 1,
    **_: Any,
) -> RewardResult:
    """Fraction of `reference` test cases the last ```python block of `completion` passes."""
    try:
        cases = parse_tests(reference)
    except MalformedTests as exc:
        return zero(f"malformed test cases: {exc}")
    code = last_python_block(completion)
    if code is None:
        return zero("no ```python code block found")
    if max_tests is not None:
        cases = cases[:max_tests]
    limits = limits or SandboxLimits()

    def run_one(case: tuple[str, str]) -> str:
        outcome = run_python(code, case[0], limits)
        if outcome.status != "ok":
            return outcome.status
        return "passed" if outputs_match(outcome.stdout, case[1]) else "wrong_output"

    statuses: list[str] = []
    if stop_on_first_failure or parallel <= 1:
        for case in cases:
            statuses.append(run_one(case))
            if stop_on_first_failure and statuses[-1] != "passed":
                break
    else:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            statuses = list(pool.map(run_one, cases))
    passed = statuses.count("passed")
    score = passed / len(cases)
    reason = "all tests passed" if passed == len(cases) else f"{passed}/{len(cases)} tests passed"
    return RewardResult(score, reason, {"tests": statuses})
