"""Rewards that fail, seen from the loop: said once in the learner's log, and a job whose every reward
fails step after step is stopped rather than trained for hours on zeros.

A failing reward scores 0 (one bad sample must not stop training), so without this a reward function
that always raises looks like a model that never answers right: reward 0.000 for every step, exit 0.
"""

from __future__ import annotations

import logging
from typing import Any

from decentralized_verl.errors import RewardFailed

log = logging.getLogger(__name__)


class RewardErrorWatch:
    """Reads each step's `reward_errors` and `samples`: logs the first failure once, and raises
    RewardFailed after `limit` steps in a row whose rewards all failed (0: never)."""

    def __init__(self, reward_type: str, limit: int) -> None:
        self.reward_type = reward_type
        self.limit = limit
        self.all_failed = 0
        """Steps in a row, up to now, in which every sample's reward failed."""
        self.said = False

    def observe(self, step: int, record: dict[str, Any]) -> None:
        errors, samples = int(record.get("reward_errors") or 0), int(record.get("samples") or 0)
        if errors and not self.said:
            self.said = True
            log.warning(
                "step %d: the reward failed on %d of %d samples (they score 0); first: %s "
                "(the reward worker's log has the sample and traceback; data.rewardErrorSteps=%d stops "
                "the job after that many steps in a row with every reward failing)",
                step, errors, samples, record.get("reward_error"), self.limit,
            )  # fmt: skip
        self.all_failed = self.all_failed + 1 if samples and errors == samples else 0
        if self.limit and self.all_failed >= self.limit:
            raise RewardFailed(
                f"data.rewardType {self.reward_type}: every reward failed for {self.all_failed} steps in a "
                f"row (steps {step - self.all_failed + 1}-{step}; data.rewardErrorSteps is {self.limit}): "
                f"{record.get('reward_error')}"
            )
