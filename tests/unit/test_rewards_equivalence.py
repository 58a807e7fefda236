"""Answer equivalence: hand-worked cases a math grader would accept or reject, plus hostile input.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from decentralized_verl.rewards.equivalence import answers_equivalent
from decentralized_verl.rewards.normalize import canonical, light, plain_number

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
