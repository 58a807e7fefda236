"""When a share of generation work is late enough to hedge: give its unanswered items to a second worker.

A share's expected time comes from its worker's measured speed, which is tokens over the wall time of its
past shares, so it already includes that worker's link: a volunteer behind a slow link is expected to be
slow and is not hedged for being itself; one that goes silent (partitioned, stopped, its link collapsed)
is hedged after `HEDGE_FACTOR` times its usual time, never sooner than `HEDGE_FLOOR_S`, instead of holding
the step until its deadline (dispatch.DEADLINE_FLOOR_S + more). Unmeasured workers are never hedged.
A worker whose share was hedged and never finished sits out a few steps (probation), so a partition costs
one hedge wait per probation period, not one per step.
"""

from __future__ import annotations

HEDGE_FACTOR = 3.0
HEDGE_FLOOR_S = 5.0


def late_after(expected_s: float | None) -> float | None:
    """Seconds into a round after which a share expected to take `expected_s` is hedged (None: never)."""
    if expected_s is None:
        return None
    return max(HEDGE_FLOOR_S, HEDGE_FACTOR * expected_s)


MAX_PROBATION_STEPS = 8


def probation_steps(strikes: int) -> int:
    """Steps a worker sits out after its `strikes`-th late share in a row: 1, 2, 4, ... up to 8. It gets
    work again after that (a partition may have healed); an on-time share clears its strikes."""
    if strikes < 1:
        return 0
    return min(MAX_PROBATION_STEPS, 2 ** (strikes - 1))
