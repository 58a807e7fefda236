"""What the loop says about each finished step and, at the end, about the whole run.

Kept apart from the loop because it is a different job: the loop decides what happens in a step, this
module turns what happened into numbers (pure: `step_record`, `run_summary`) and hands each step's to
everyone watching (`StepReporter`: the status board the operator polls, the pod log's progress line, the
metrics file and trackers, the caller's `on_step` hook, the periodic table of sample generations).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from decentralized_verl.core.samples import Sample
from decentralized_verl.core.status import RefitParity, StatusBoard
from decentralized_verl.environments.metrics import episode_metrics
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.reporting.progress import eta_seconds, progress_line
from decentralized_verl.rewards.result import is_reward_error


def step_record(
    *,
    step: int,
    version: int,
    samples: Sequence[Sample],
    report: Any,
    expected_samples: int,
    stale_dropped: int,
    staleness: int,
    step_seconds: float,
    timings: dict[str, float],
    learned: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """One step's metrics row: rewards and lengths of every generated sample (kept by the filters or
    not), the rollout's dispatch report, phase timings, episode metrics, then what learning measured
    (`learned`, in order: the filters', then the update's)."""
    rewards = [float(s.score or 0.0) for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    errors = [s.score_reason for s in samples if is_reward_error(s.score_reason)]
    record: dict[str, Any] = {
        "step": step,
        "policy_version": version,
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_errors": len(errors),
        **({"reward_error": errors[0]} if errors else {}),
        "response_length_mean": statistics.fmean(lengths),
        "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
        "tokens": report.tokens,
        "tokens_per_second": report.tokens / max(report.seconds, 1e-9),
        "step_seconds": step_seconds,
        "redispatched": report.redispatched,
        "hedged": report.hedged,
        "continued": report.continued,
        "worker_failures": len(report.failures),
        "rollout_workers": len(report.assigned),
        "samples_by_worker": samples_by_worker(samples),
        "samples": len(samples),
        "expected_samples": expected_samples,
        "stale_dropped": stale_dropped,
        "staleness": staleness,
        "unique_samples": len({s.key for s in samples}),
        "duplicates_dropped": report.duplicates_dropped,
        **{f"time_{k}": v for k, v in timings.items()},
        **episode_metrics(samples),
    }
    for measured in learned:
        record.update(measured)
    return record


def samples_by_worker(samples: Sequence[Sample]) -> dict[str, int]:
    """How many of a step's samples each worker produced, so a slow peer's share shows every step."""
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample.worker_id] = counts.get(sample.worker_id, 0) + 1
    return counts


def run_summary(
    *,
    steps: int,
    version: int,
    seconds: float,
    rewards: Sequence[float],
    before: dict[str, Any],
    after: dict[str, Any],
    last_checkpoint: str,
) -> dict[str, Any]:
    """The run's summary: the mean reward over the first and the last few steps (a window of a third of
    the steps, 1 to 5), and the held-out accuracy before and after training with its 95% interval."""
    window = max(1, min(5, len(rewards) // 3 or 1))
    return {
        "steps": steps,
        "policy_version": version,
        "seconds": seconds,
        "reward_first": statistics.fmean(rewards[:window]) if rewards else math.nan,
        "reward_last": statistics.fmean(rewards[-window:]) if rewards else math.nan,
        "eval_accuracy_before": before.get("eval_accuracy"),
        "eval_accuracy_after": after.get("eval_accuracy"),
        "eval_interval_before": _accuracy_interval(before),
        "eval_interval_after": _accuracy_interval(after),
        "eval_problems": after.get("eval_problems") or before.get("eval_problems"),
        "last_checkpoint": last_checkpoint,
    }


def _accuracy_interval(evaluation: dict[str, Any]) -> list[float] | None:
    """The 95% interval of an evaluation's accuracy (None: nothing was evaluated)."""
    if "eval_accuracy_low" not in evaluation:
        return None
    return [evaluation["eval_accuracy_low"], evaluation["eval_accuracy_high"]]


class StepReporter:
    """Hands each step's record to the status board, the log, the metrics file and the `on_step` hook."""

    def __init__(
        self,
        status: StatusBoard,
        metrics: MetricsLog | None,
        on_step: Callable[[dict[str, Any]], None] | None,
        tracking: Any,
        total_steps: int,
        log: logging.Logger,
    ) -> None:
        """`log` is the loop's own logger: the progress line appears under the loop's name in a pod log."""
        self.status, self.metrics, self.on_step = status, metrics, on_step
        self.tracking, self.total_steps, self.log = tracking, total_steps, log
        self._pace_from: tuple[int, float] | None = None
        """(step, monotonic time) the run started at, for the ETA of the per-step progress line."""

    def start_pace(self, step: int) -> None:
        """Training starts now at `step`: the ETA measures the pace from here (not the evaluation before)."""
        self._pace_from = (step, time.monotonic())

    def publish(
        self,
        step: int,
        version: int,
        record: dict[str, Any],
        timings: dict[str, float],
        parity: RefitParity | None = None,
    ) -> None:
        """The step on the board, in the log, the metrics file and the hook; the board keeps the latest
        refit parity when this step measured none."""
        kept = {"refit_parity": parity} if parity is not None else {}
        self.status.update(
            **kept,
            step=step,
            total_steps=self.total_steps,
            reward_mean=record["reward_mean"],
            reward_std=record["reward_std"],
            kl=float(record.get("kl", 0.0)),
            response_length_mean=record["response_length_mean"],
            policy_version=version,
            tokens_per_second=record["tokens_per_second"],
            phase_seconds=tuple(sorted(timings.items())),
            phase="idle",
        )
        self.log.info(self.progress_line(step, record))
        if self.metrics is not None:
            self.metrics.write({"time": time.time(), **record})
        if self.on_step is not None:
            self.on_step(record)

    def progress_line(self, step: int, record: dict[str, Any]) -> str:
        """The step's line in the learner log (a pod log has no progress bar)."""
        first_step, since = self._pace_from or (step - 1, time.monotonic())
        eta = eta_seconds(step, self.total_steps, time.monotonic() - since, first_step)
        return progress_line(
            step,
            self.total_steps,
            record.get("reward_mean"),
            record.get("tokens_per_second"),
            eta,
            accuracy=record.get("eval_accuracy"),
        )

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        """Every `tracking.samplesEvery` steps, a few generations as a table (what a person reads to see
        what the numbers mean)."""
        tracking = self.tracking
        if self.metrics is None or not tracking.samples_every or step % tracking.samples_every:
            return
        rows = [
            {"prompt": s.prompt.text, "response": s.text, "reward": s.score}
            for s in list(samples)[: tracking.samples]
        ]
        self.metrics.write_samples(step, rows)
