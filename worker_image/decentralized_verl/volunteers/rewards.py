"""The quick start's default reward, for prompt-only data (a prompts.json list has no answers).

A stand-in that needs no ground truth and no reward model: the share of the completion made of letters
and spaces, so a policy is pushed from character noise towards word-like text. Real jobs pass
`--reward-type` (boxed, think_answer_tags, code, module:function) or `--reward-model PATH`.
"""

from __future__ import annotations

QUICKSTART_REWARD = "decentralized_verl.volunteers.rewards:letters"


def letters(completion: str, reference: object = None, prompt: str | None = None) -> float:
    """Fraction of characters that are letters or spaces; 0.0 for an empty completion."""
    text = completion or ""
    if not text:
        return 0.0
    return sum(1 for ch in text if ch.isalpha() or ch == " ") / len(text)
