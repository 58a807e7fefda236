"""`calculator`: the model may ask for arithmetic with `<calc>EXPR</calc>` before giving its answer.

Every `<calc>` in a turn is evaluated by the safe evaluator (`arithmetic.py`) and the results come back
as one tool message (`12*7 = 84`). A turn without `<calc>` is the final answer, scored against the
record's reference (`answers.py`). A malformed expression is a tool error: its message is the observation,
and the model may try again.
"""

from __future__ import annotations

import re
from typing import ClassVar

from decentralized_verl.environments.answers import score_answer
from decentralized_verl.environments.arithmetic import NotArithmetic, evaluate, format_number
from decentralized_verl.environments.base import EpisodeRecord, StepInfo, StepResult
from decentralized_verl.spec.catalogue.environments import CalculatorOptions

_CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


class Calculator:
    """Arithmetic on request; the final answer is scored against the record's."""

    Options = CalculatorOptions
    instructions: ClassVar[str] = (
        "You can use a calculator: write <calc>EXPRESSION</calc> (numbers, + - * / // % ** and "
        "parentheses) and the result comes back. When you know the answer, reply with it without <calc>."
    )

    def __init__(self, options: CalculatorOptions | None = None) -> None:
        self.options = options or CalculatorOptions()
        self.record: EpisodeRecord | None = None

    def reset(self, record: EpisodeRecord) -> None:
        self.record = record

    def step(self, turn: str) -> StepResult:
        assert self.record is not None, "reset before step"
        calls = _CALL.findall(turn)
        if not calls:
            reward, why = score_answer(
                turn, self.record.ground_truth, self.options.answer_reward, prompt=self.record.prompt_text
            )
            return StepResult(None, reward, done=True, info=StepInfo(reason=f"answered: {why}"))
        lines, errors = [], 0
        for expression in calls[: self.options.max_calls_per_turn]:
            try:
                lines.append(f"{expression.strip()} = {format_number(evaluate(expression))}")
            except NotArithmetic as exc:
                errors += 1
                lines.append(f"{expression.strip()[:60]}: error: {exc}")
        if len(calls) > self.options.max_calls_per_turn:
            lines.append(f"(only the first {self.options.max_calls_per_turn} calculations are done per turn)")
        info = StepInfo(tool_calls=min(len(calls), self.options.max_calls_per_turn), tool_errors=errors)
        return StepResult("\n".join(lines), info=info)
