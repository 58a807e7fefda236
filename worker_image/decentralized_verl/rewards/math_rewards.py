r"""Verifiable math rewards: `boxed` and `think_answer_tags` (the two math reward types).

Reward values (all overridable as options of `score`):
- `boxed`: `correct_score` (1.0) when the last `\boxed{}` is equivalent to the reference, else
  `wrong_score` (0.0). No box scores 0.0.
- `think_answer_tags`: the completion is well-formed when `<think>…</think>` precedes
  `<answer>…</answer>` (each tag once, in order). Well-formed earns `format_score` (0.1); a well-formed
  completion whose answer is also correct earns `format_score + correct_score` (0.1 + 0.9 = 1.0). A
  correct answer without the format earns nothing unless `require_format=False`, in which
  case it earns `correct_score` alone. Nothing right scores 0.0.
"""

from __future__ import annotations

from typing import Any

from decentralized_verl.rewards.equivalence import DEFAULT_TIMEOUT_S, answers_equivalent
from decentralized_verl.rewards.extract import last_answer_tag, last_boxed, think_answer_format_ok
from decentralized_verl.rewards.result import RewardResult, zero


def reference_answer(reference: Any) -> str | None:
    r"""The gold answer as text: a str/int/float, or a str holding `\boxed{...}` (MATH-style solutions)."""
    if isinstance(reference, bool) or reference is None:
        return None
    if isinstance(reference, int | float):
        return repr(reference) if isinstance(reference, float) else str(reference)
    if not isinstance(reference, str) or not reference.strip():
        return None
    boxed = last_boxed(reference)
    return boxed if boxed is not None else reference.strip()


def boxed_reward(
    completion: str,
    reference: Any,
    *,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    use_math_verify: bool = True,
    **_: Any,
) -> RewardResult:
    r"""Score the last `\boxed{...}` of `completion` against `reference`."""
    gold = reference_answer(reference)
    if gold is None:
        return zero(f"reference answer is missing or not text ({type(reference).__name__})")
    answer = last_boxed(completion)
    if answer is None:
        return zero("no \\boxed{} answer found")
    verdict = answers_equivalent(answer, gold, timeout_s=timeout_s, use_math_verify=use_math_verify)
    details = {"answer": answer, "gold": gold, "method": verdict.method}
    if verdict.equal:
        return RewardResult(float(correct_score), "correct", details)
    return RewardResult(float(wrong_score), "wrong answer", details)


def think_answer_tags_reward(
    completion: str,
    reference: Any,
    *,
    correct_score: float = 0.9,
    format_score: float = 0.1,
    require_format: bool = True,
    think_open_in_prompt: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    use_math_verify: bool = True,
    **_: Any,
) -> RewardResult:
    """Score `<think>…</think><answer>…</answer>`: a format bonus plus credit for a correct answer."""
    gold = reference_answer(reference)
    if gold is None:
        return zero(f"reference answer is missing or not text ({type(reference).__name__})")
    format_ok = think_answer_format_ok(completion, think_open_in_prompt=think_open_in_prompt)
    answer = last_answer_tag(completion)
    base = float(format_score) if format_ok else 0.0
    details: dict[str, Any] = {"answer": answer, "gold": gold, "format_ok": format_ok}
    if answer is None:
        return RewardResult(base, "no <answer> tag found", details)
    if not format_ok and require_format:
        return RewardResult(0.0, "bad format: <think>…</think> must precede <answer>…</answer>", details)
    verdict = answers_equivalent(answer, gold, timeout_s=timeout_s, use_math_verify=use_math_verify)
    details["method"] = verdict.method
    if verdict.equal:
        reason = "correct" if format_ok else "correct answer, bad format"
        return RewardResult(base + float(correct_score), reason, details)
    return RewardResult(base, "wrong answer, good format" if format_ok else "wrong answer", details)
