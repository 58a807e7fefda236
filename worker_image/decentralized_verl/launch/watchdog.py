"""Is the learner still making progress? A pure clock fed with the step numbers the Status RPC reports.

A learner that stops advancing while its process lives (a deadlock, a wedged collective, SIGSTOP) is
restarted like one that died: `dverl run` asks this after every poll (the operator keeps the same clock in
`.status.lastProgressTime`). Its allowance is `stallFactor` times the median step time, never less than
STALL_FLOOR_S; before the first step of an incarnation (model load, first compile) STARTUP_S.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

STALL_FLOOR_S = 60.0
STARTUP_S = 900.0


def allowance(step_seconds: list[float], stall_factor: float) -> float:
    """How long a step may take before the learner counts as stalled."""
    if not step_seconds:
        return STARTUP_S
    return max(STALL_FLOOR_S, stall_factor * statistics.median(step_seconds))


@dataclass
class ProgressClock:
    stall_factor: float
    last_step: int | None = None
    last_change: float = 0.0
    step_seconds: list[float] = field(default_factory=list)

    def restarted(self, now: float) -> None:
        """A new learner incarnation: its first step may take a model load longer."""
        self.last_step, self.last_change = None, now

    def observe(self, step: int | None, now: float) -> None:
        """A Status poll's step (None: no answer, which is no progress)."""
        if step is None:
            return
        if self.last_step is not None and step > self.last_step:
            self.step_seconds.append((now - self.last_change) / (step - self.last_step))
            self.step_seconds = self.step_seconds[-50:]
        if step != self.last_step:
            self.last_step, self.last_change = step, now

    def stalled(self, now: float) -> bool:
        limit = STARTUP_S if self.last_step is None else allowance(self.step_seconds, self.stall_factor)
        return now - self.last_change > limit
