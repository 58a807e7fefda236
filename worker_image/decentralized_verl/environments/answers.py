"""Scoring an episode's final answer: a number compared with the record's, or any reward type by name.

The built-in rule reads the answer as the content of the last `\\boxed{}` when there is one, else the
last number of the turn, and compares it exactly with the reference (as rationals, so `0.5` equals
`1/2`). With `answerReward` set, the final turn is scored by that reward type instead (`boxed`, `code`, a
`module:function`), exactly as single-turn completions are.
"""

from __future__ import annotations

import re
from fractions import Fraction

from decentralized_verl.environments.arithmetic import NotArithmetic, evaluate
from decentralized_verl.rewards.extract import last_boxed
from decentralized_verl.rewards.scoring import score

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def as_number(text: str) -> Fraction | None:
    """`text` as an exact number (an integer, decimal, fraction or arithmetic expression), else None."""
    cleaned = text.strip().replace(",", "").removeprefix("$").removesuffix("$").strip()
    if not cleaned:
        return None
    try:
        return evaluate(cleaned)
    except NotArithmetic:
        return None


def final_number(turn: str) -> Fraction | None:
    """The answer a final turn gives: its last `\\boxed{}` content, else its last number."""
    boxed = last_boxed(turn)
    if boxed is not None:
        return as_number(boxed)
    numbers = _NUMBER.findall(turn.replace(",", ""))
    return as_number(numbers[-1]) if numbers else None


def score_answer(
    turn: str, reference: str, answer_reward: str | None, *, prompt: str = ""
) -> tuple[float, str]:
    """(reward, reason) of the final turn against the record's reference."""
    if answer_reward is not None:
        result = score(answer_reward, turn, reference, prompt=prompt)
        return float(result.score), result.reason
    gold = as_number(reference)
    if gold is None:
        return 0.0, f"reference {reference!r:.40} is not a number"
    answer = final_number(turn)
    if answer is None:
        return 0.0, "no number in the final answer"
    return (1.0, "correct") if answer == gold else (0.0, "wrong answer")
