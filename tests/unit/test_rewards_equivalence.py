"""Answer equivalence: hand-worked cases a math grader would accept or reject, plus hostile input.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from decentralized_verl.rewards.equivalence import answers_equivalent
from decentralized_verl.rewards.normalize import canonical, light, plain_number
from tests.support.answer_cases import EQUAL, NOT_EQUAL


def test_enough_cases() -> None:
    assert len(EQUAL) + len(NOT_EQUAL) >= 40


def test_common_cases_need_no_math_verify() -> None:
    """Plain numbers and formatting differences are decided in-process, without the child."""
    for pred, gold in [("1,000", "1000"), ("0.5", "\\frac{1}{2}"), ("x = 3", "3"), ("-3", "3")]:
        assert answers_equivalent(pred, gold, use_math_verify=False).method in {"string", "number"}


def test_normalisers() -> None:
    assert light("$\\left( 1,\\!000 \\right)$") == "( 1, 000 )"
    assert light("1\\,000") == "1000"
    assert canonical("x = 10\\text{ cm}") == "10"
    assert canonical("\\textbf{Yes}.") == "yes"
    assert plain_number("\\dfrac{-6}{4}") == plain_number("-1.5")
    assert plain_number("1/0") is None
    assert plain_number("\\sqrt{2}") is None
