"""Held-out evaluation of the policy: greedy answers scored by the reward, as an accuracy with its interval.

A concern of its own beside the training loop: it has its own memory (the last policy version evaluated,
the accuracy history) and its own outputs (the status board's accuracy, the metrics file's eval rows),
and the loop only decides when it runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from decentralized_verl.core.interfaces import RewardClient
from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.status import StatusBoard
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.reporting.stats import wilson_interval


class Evaluator:
    """Evaluates a policy version on the held-out prompts, at most once per version."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        dispatcher: Dispatcher,
        reward: RewardClient,
        reward_type: str,
        status: StatusBoard,
        metrics: MetricsLog | None,
    ) -> None:
        self.prompts, self.dispatcher, self.reward = prompts, dispatcher, reward
        self.reward_type, self.status, self.metrics = reward_type, status, metrics
        self.history: list[tuple[int, float]] = []
        """(step, accuracy) of every evaluation that generated answers."""
        self._last: tuple[int, dict[str, float]] | None = None
        """(policy version, result) of the latest evaluation: the same policy is not evaluated twice."""

    async def evaluate(self, step: int, version: int, sampling: SamplingParams) -> dict[str, float]:
        """Greedy answers on the held-out prompts; accuracy = share of fully correct answers.

        A policy version already evaluated (the last step's periodic evaluation when `evalEvery` divides
        the steps, then the final one) returns that result again without generating or writing a second
        row: greedy answers of the same weights are the same answers.
        """
        if not self.prompts:
            return {}
        if self._last is not None and self._last[0] == version:
            return dict(self._last[1])
        items = [(prompt, 0) for prompt in self.prompts]
        samples, _ = await self.dispatcher.run(items, sampling, version)
        scores = await self.reward.score(samples, self.reward_type)
        values = [s for s, _ in scores]
        correct = sum(1 for v in values if v >= 1.0 - 1e-6)
        accuracy = correct / len(values)
        low, high = wilson_interval(correct, len(values))
        self.history.append((step, accuracy))
        self.status.update(eval_accuracy=accuracy)
        result = {
            "eval_accuracy": accuracy,
            "eval_accuracy_low": low,
            "eval_accuracy_high": high,
            "eval_problems": len(values),
            "eval_reward_mean": statistics.fmean(values),
        }
        if self.metrics is not None:  # every evaluation, the one before training (step 0) too
            self.metrics.write_eval({"step": step, **result})
        self._last = (version, dict(result))
        return result
