"""`score` / `score_batch`: the entry points reward workers call. They never raise for bad samples."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from traceback import format_exc
from typing import Any

from decentralized_verl.rewards.apart import call_apart, runs_apart
from decentralized_verl.rewards.custom import call_custom
from decentralized_verl.rewards.registry import REWARD_TYPES
from decentralized_verl.rewards.result import RewardResult, failed, zero
from decentralized_verl.rewards.reward_model import reward_model_batch
from decentralized_verl.spec.catalogue.rewards import CALLABLE_PATTERN


def score(
    reward_type: str, completion: Any, reference: Any, *, prompt: str | None = None, **options: Any
) -> RewardResult:
    """Score one completion against its reference (gold answer, test cases, or unused for reward models).

    reward_type: `boxed`, `think_answer_tags`, `code`, `reward_model` (pass `scorer=`), or
    `module:function`. Options go to the reward function (e.g. `correct_score`, `limits`).
    A bad sample scores 0.0 with a reason; only an unknown reward_type is a caller error (still 0.0).
    """
    if not isinstance(completion, str):
        return zero(f"completion is {type(completion).__name__}, not text")
    fn = REWARD_TYPES.get(reward_type)
    if fn is None:
        if isinstance(reward_type, str) and CALLABLE_PATTERN.match(reward_type):
            if runs_apart(reward_type):
                return call_apart(reward_type, completion, reference, prompt, options)
            return call_custom(reward_type, completion, reference, prompt, options)
        return zero(f"unknown reward type {reward_type!r}")
    try:
        return fn(completion, reference, prompt=prompt, **options)
    except Exception as exc:  # a bug in a reward must not stop training
        return failed(
            f"{reward_type} raised {type(exc).__name__}: {exc}"[:300], traceback=format_exc(limit=-8)
        )


def score_batch(
    reward_type: str,
    completions: Sequence[Any],
    references: Sequence[Any],
    *,
    prompts: Sequence[str | None] | None = None,
    workers: int = 1,
    **options: Any,
) -> list[RewardResult]:
    """`score` over aligned lists. `reward_model` runs as batches through its scorer; other types run
    sample by sample, on `workers` threads (useful for `code`, whose runs are subprocesses)."""
    n = len(completions)
    if len(references) != n or (prompts is not None and len(prompts) != n):
        got = f"{n} completions, {len(references)} references" + (
            f", {len(prompts)} prompts" if prompts is not None else ""
        )
        return [zero(f"batch lengths differ ({got})")] * n
    prompt_list: list[str | None] = list(prompts) if prompts is not None else [None] * n
    if reward_type == "reward_model":
        return reward_model_batch(completions, references, prompts=prompt_list, **options)

    def one(i: int) -> RewardResult:
        return score(reward_type, completions[i], references[i], prompt=prompt_list[i], **options)

    if workers <= 1 or n <= 1:
        return [one(i) for i in range(n)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(n)))
