"""Answer equivalence: hand-worked cases a math grader would accept or reject, plus hostile input.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import time

import pytest

from decentralized_verl.rewards.equivalence import MathVerifyProcess, answers_equivalent
from tests.support.answer_cases import EQUAL, NOT_EQUAL


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
