"""Extraction and the boxed / think_answer_tags rewards, with the documented reward values."""

from __future__ import annotations

import pytest

from decentralized_verl.rewards import score
from decentralized_verl.rewards.extract import (
    last_answer_tag,
    last_boxed,
    last_python_block,
    think_answer_format_ok,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{a_{b_{c}}} end", "a_{b_{c}}"),
        ("$\\fbox{7}$", "7"),
        ("\\boxed 5$", "5"),
        ("\\boxed{ 3 }", " 3 "),
        ("no box", None),
        ("\\boxed{1} and truncated \\boxed{12", None),
        ("\\boxedx{3}", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_answer_tags_and_format() -> None:
    good = "<think>2+2</think> <answer> 4 </answer>"
    assert last_answer_tag(good) == "4"
    assert last_answer_tag("<answer>1</answer><answer>2</answer>") == "2"
    assert last_answer_tag("<answer>unclosed") is None
    assert think_answer_format_ok(good)
    assert not think_answer_format_ok("<answer>4</answer><think>x</think>")
    assert not think_answer_format_ok("<think>a</think><think>b</think><answer>4</answer>")
    assert not think_answer_format_ok("<answer>4</answer>")
    assert think_answer_format_ok("reasoning</think><answer>4</answer>", think_open_in_prompt=True)
    assert not think_answer_format_ok("<think>x</think><answer>4</answer>", think_open_in_prompt=True)


def test_last_python_block() -> None:
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert last_python_block(text) == "print(2)\n"
    assert last_python_block("```\nprint(1)\n```") is None


def test_boxed_reward_values() -> None:
    assert score("boxed", "thus \\boxed{\\dfrac12}", "0.5").score == 1.0
    wrong = score("boxed", "thus \\boxed{3}", "4")
    assert (wrong.score, wrong.reason) == (0.0, "wrong answer")
    missing = score("boxed", "the answer is 4", "4")
    assert (missing.score, missing.reason) == (0.0, "no \\boxed{} answer found")
    # MATH-style reference solutions carry their answer in a box too
    assert score("boxed", "\\boxed{1,000}", "so we get $\\boxed{1000}$.").score == 1.0
    assert score("boxed", "\\boxed{7}", 7).score == 1.0
    assert score("boxed", "\\boxed{1}", "1", correct_score=5.0).score == 5.0


@pytest.mark.parametrize(
    ("completion", "expected", "reason"),
    [
        ("<think>6*7</think><answer>42</answer>", 1.0, "correct"),
        ("<think>6*7</think><answer>41</answer>", 0.1, "wrong answer, good format"),
        ("<answer>42</answer>", 0.0, "bad format"),
        ("<think>6*7</think>", 0.0, "no <answer> tag found"),
        ("42", 0.0, "no <answer> tag found"),
    ],
)
def test_think_answer_tags_values(completion: str, expected: float, reason: str) -> None:
    result = score("think_answer_tags", completion, "42")
    assert result.score == pytest.approx(expected)
    assert result.reason.startswith(reason)


def test_think_answer_tags_options() -> None:
    lenient = score("think_answer_tags", "<answer>42</answer>", "42", require_format=False)
    assert (lenient.score, lenient.reason) == (pytest.approx(0.9), "correct answer, bad format")
    custom = score(
        "think_answer_tags", "<think>.</think><answer>42</answer>", "42", format_score=1.0, correct_score=9.0
    )
    assert custom.score == 10.0


@pytest.mark.parametrize("reference", [None, "", "   ", ["4"], {"a": 1}, True])
@pytest.mark.parametrize("reward_type", ["boxed", "think_answer_tags"])
def test_bad_references_score_zero(reward_type: str, reference: object) -> None:
    result = score(reward_type, "<think>.</think><answer>4</answer> \\boxed{4}", reference)
    assert result.score == 0.0
    assert "reference" in result.reason


@pytest.mark.parametrize("completion", [None, 42, b"\\boxed{4}"])
def test_non_text_completion_scores_zero(completion: object) -> None:
    result = score("boxed", completion, "4")
    assert result.score == 0.0 and "not text" in result.reason
