"""Each sample's own sampling seed, from a rollout request's base seed and the sample's identity.

The coordinator gives a rollout request one base seed; the rollout worker draws each (prompt, sample) item,
and each model turn of a multi-turn episode, with a seed derived here. So a sample comes out the same
whichever worker draws it, in whichever batch, after a re-dispatch, and the trusted side can replay a
volunteer's draws (`volunteers.sampling_check`). Pure: the rollout worker and the check both import it.
"""

from __future__ import annotations

import hashlib

SEED_MASK = (1 << 63) - 1
"""Seeds are 63-bit: every generator takes them as a non-negative signed 64-bit integer."""


def item_seed(seed: int, prompt_id: str, sample_index: int) -> int:
    """A 63-bit seed that depends only on (seed, prompt, sample index).

    So a sample is the same whichever worker draws it, in whichever batch, after a re-dispatch.
    """
    digest = hashlib.sha256(f"{seed}\x00{prompt_id}\x00{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & SEED_MASK


def turn_seed(seed: int, prompt_id: str, sample_index: int, turn: int) -> int:
    """The seed of model turn `turn` (0-based) of an episode: each turn its own, so a re-dispatched episode
    plays out the same and the trusted side can replay every turn's draws (`volunteers.sampling_check`)."""
    return item_seed(seed, f"{prompt_id}\x00turn{turn}", sample_index)
