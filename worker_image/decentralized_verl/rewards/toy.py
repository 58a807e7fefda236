"""A reward for the toy task a tiny model learns from scratch (examples/tiny-grpo.yaml).

A randomly initialised character model never writes `\\boxed{}`, so the toy job uses this callable
(`rewardType: decentralized_verl.rewards.toy:first_number`): full credit when the first number in the
completion is the answer, partial credit that shrinks with the distance to the answer otherwise. The
graded part keeps reward variance inside every GRPO group, so the policy cannot collapse onto one
constant answer with zero advantage everywhere. It also shows the `module:function` reward type at work.
"""

from __future__ import annotations

import re

from decentralized_verl.rewards.result import RewardResult

_NUMBER = re.compile(r"-?\d+")


def first_number(completion: str, reference: str, prompt: str | None = None) -> RewardResult:
    text = (completion or "").strip()
    match = _NUMBER.match(text)
    if match is None:
        return RewardResult(0.0, "does not start with a number")
    if match.group(0) == str(reference).strip():
        return RewardResult(1.0, "correct")
    try:
        distance = abs(int(match.group(0)) - int(str(reference).strip()))
    except ValueError:
        return RewardResult(0.0, f"reference {reference!r} is not an integer")
    return RewardResult(
        0.5 * max(0.0, 1.0 - distance / 10), f"{match.group(0)} is {distance} away from {reference}"
    )
