"""Answer equivalence: hand-worked cases a math grader would accept or reject, plus hostile input.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import time

import pytest

from decentralized_verl.rewards.equivalence import MathVerifyProcess, answers_equivalent

EQUAL = [
    ("1000", "1000"),
    ("1,000", "1000"),
    ("1\\,000", "1000"),
    ("1 000", "1000"),
    ("1\u2009000", "1000"),
    ("12,345,678", "12345678"),
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("\\dfrac12", "0.5"),
    ("\\tfrac{1}{2}", "1/2"),
    ("\\dfrac{3}{4}", "0.75"),
    ("-\\frac{1}{2}", "-0.5"),
    ("3.0", "3"),
    ("50\\%", "50"),
    ("50%", "50"),
    ("50\\%", "0.5"),
    ("10\\text{ cm}", "10"),
    ("10 \\mathrm{cm}", "10"),
    ("5 \\text{ dollars}", "5"),
    ("\\$5", "5"),
    ("x = 3", "3"),
    ("y=-7", "-7"),
    ("$3$", "3"),
    ("$$\\frac{2}{3}$$", "2/3"),
    ("\\(4\\)", "4"),
    ("-3", "-3"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"),
    ("2^{10}", "1024"),
    ("10^{-3}", "0.001"),
    ("3\\times 10^{2}", "300"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("\\text{Monday}", "monday"),
    ("\\infty", "\\infty"),
    ("\\pi", "\\pi"),
    ("42.", "42"),
]

NOT_EQUAL = [
    ("-3", "3"),
    ("1001", "1000"),
    ("1,2", "12"),
    ("0.333", "1/3"),
    ("\\frac{1}{3}", "0.5"),
    ("x^2+1", "(x+1)^2"),
    ("[1,2]", "(1,2)"),
    ("\\sqrt{2}", "2"),
    ("\\text{Tuesday}", "Monday"),
    ("3.14", "\\pi"),
    ("2", "-\\frac{1}{2}"),
    ("12", "1.2"),
]


@pytest.mark.parametrize(("pred", "gold"), EQUAL)
def test_equivalent_answers_are_accepted(pred: str, gold: str) -> None:
    verdict = answers_equivalent(pred, gold)
    assert verdict.equal, verdict


@pytest.mark.parametrize(("pred", "gold"), NOT_EQUAL)
def test_different_answers_are_rejected(pred: str, gold: str) -> None:
    verdict = answers_equivalent(pred, gold)
    assert not verdict.equal, verdict


def test_hostile_input_times_out_and_falls_back() -> None:
    """A tower of powers would make sympy spin; the comparison ends near the limit and says so."""
    verifier = MathVerifyProcess()
    try:
        started = time.monotonic()
        verdict = answers_equivalent("9^{9^{9^{9^{9}}}}", "5", timeout_s=1.0, verifier=verifier)
        elapsed = time.monotonic() - started
        assert not verdict.equal
        assert elapsed < 4.0
        # the verifier still works afterwards (restarted if it had to be killed)
        assert answers_equivalent("2\\sqrt{2}", "\\sqrt{8}", verifier=verifier).equal
    finally:
        verifier.close()


def test_killed_child_is_replaced() -> None:
    verifier = MathVerifyProcess()
    try:
        assert verifier.compare("\\sqrt{8}", "2\\sqrt{2}", 5.0)[0] is True
        assert verifier._proc is not None
        verifier._proc.kill()
        verifier._proc.wait()
        assert verifier.compare("\\sqrt{8}", "2\\sqrt{2}", 5.0)[0] is True
        assert verifier.restarts == 1
    finally:
        verifier.close()


@pytest.mark.parametrize("garbage", ["\\frac{", "}}}{{{", "\\boxed{", "$", "", "\\\\", "\x00\x01"])
def test_garbage_answers_are_wrong_not_errors(garbage: str) -> None:
    assert not answers_equivalent(garbage, "1").equal
