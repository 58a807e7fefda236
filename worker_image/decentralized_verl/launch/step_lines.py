"""What `dverl run` prints off a terminal: how start-up goes, then one line per step and each evaluation.

Lines come from the run folder's `metrics.jsonl` and `eval.jsonl`, read as they grow, not from the
learner's Status RPC: a poll sees only the newest step, so steps that end between two polls would be
skipped and an evaluation shown on whichever step the next poll caught. Reading the files prints every
step once, in order, and each evaluation under the step it was taken on. A run whose files are elsewhere
(Ray) falls back to the Status RPC's numbers. Start-up (workers starting and the model loading, waiting
for the rollout workers, the baseline evaluation) is announced as each phase begins, with how long the
one before it took, so a job that loads a model for minutes is visibly not hung.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from decentralized_verl.core.status import JobStatus
from decentralized_verl.reporting.metrics import EVAL_FILE
from decentralized_verl.reporting.progress import eta_seconds, format_duration, progress_line


class JsonlTail:
    """The rows appended to a JSONL file since the last read; a line still being written waits for
    its newline, and a file rewritten shorter (a resumed run drops later rows) is read again from the top."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_rows(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset = 0
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
        return rows


def eval_line(row: dict[str, Any]) -> str:
    """`eval step 10: accuracy 55.0% [45.2-64.5] on 100 problems`."""
    accuracy = f"accuracy {100 * float(row['eval_accuracy']):.1f}%"
    if row.get("eval_accuracy_low") is not None and row.get("eval_accuracy_high") is not None:
        accuracy += f" [{100 * row['eval_accuracy_low']:.1f}-{100 * row['eval_accuracy_high']:.1f}]"
    problems = f" on {row['eval_problems']} problems" if row.get("eval_problems") else ""
    return f"eval step {row['step']}: {accuracy}{problems}"


class RewardErrorNotice:
    """The first failed reward of the run, said once on the console (each step's line counts them)."""

    def __init__(self) -> None:
        self.said = False

    def line(self, row: dict[str, Any]) -> str | None:
        if self.said or not row.get("reward_errors"):
            return None
        self.said = True
        return (
            f"reward error at step {row['step']} ({row['reward_errors']} of {row.get('samples', '?')} "
            f"samples scored 0 because the reward failed): {row.get('reward_error', '?')}; the reward "
            "worker's log has the sample and traceback"
        )


class StepLines:
    """One line per finished step (every `every`-th, and the last), each evaluation on its step."""

    def __init__(
        self, folder: Path | None = None, *, total: int = 0, every: int = 1, out: TextIO | None = None
    ) -> None:
        self.metrics = JsonlTail(folder / "metrics.jsonl") if folder is not None else None
        self.evals = JsonlTail(folder / EVAL_FILE) if folder is not None else None
        self.total = total
        self.every = max(1, every)
        self.out = out
        self.seen = 0
        """The last step whose line was due (printed, or skipped by `every`)."""
        self.pending_evals: dict[int, dict[str, Any]] = {}
        self.errors = RewardErrorNotice()
        self.pace_from: tuple[int, float] | None = None

    def show(self, status: JobStatus | None, now: float) -> None:
        """Print what finished since the last call: from the files, else from `status`."""
        if status is not None and status.total_steps:
            self.total = status.total_steps
        rows = self.metrics.new_rows() if self.metrics is not None else []
        for row in self.evals.new_rows() if self.evals is not None else []:
            self.pending_evals[row["step"]] = row
        self._evals_up_to(self.seen)
        for row in rows:
            self._step(row["step"], row, float(row.get("time") or now))
        if not rows and status is not None and status.reported and not self._files_written():
            self._step(status.step, _row_of(status), now)

    def catch_up(self, *_: object) -> None:
        """Print the steps and evaluations that ended after the last poll."""
        self.show(None, 0.0)

    def _files_written(self) -> bool:
        return self.metrics is not None and self.metrics.path.exists()

    def _step(self, step: int, row: dict[str, Any], when: float) -> None:
        if step <= self.seen:
            return
        if self.pace_from is None or step < self.pace_from[0]:
            self.pace_from = (step, when)  # the first step's own start is unknown: pace from here
        first, since = self.pace_from
        self.seen = step
        if step % self.every == 0 or step == self.total:
            eta = eta_seconds(step, self.total, when - since, first)
            line = progress_line(
                step, self.total, row.get("reward_mean"), row.get("tokens_per_second"), eta, None
            )
            if row.get("reward_errors"):
                line += f" reward_errors {row['reward_errors']}"
            self._print(line)
        notice = self.errors.line({"step": step, **row})
        if notice is not None:
            self._print(notice)
        self._evals_up_to(step)

    def _evals_up_to(self, step: int) -> None:
        for at in sorted(s for s in self.pending_evals if s <= step):
            self._print(eval_line(self.pending_evals.pop(at)))

    def _print(self, line: str) -> None:
        print(line, file=self.out or sys.stderr, flush=True)


def _row_of(status: JobStatus) -> dict[str, Any]:
    return {"reward_mean": status.reward_mean, "tokens_per_second": status.tokens_per_second}


class StartupPhases:
    """Names the phase a starting run is in as it changes, with how long the one before took."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.phase: str | None = None
        self.since = 0.0
        self.done = False

    def begin(self, workers: int, now: float) -> None:
        """The workers were just started; the learner answers once its model is loaded."""
        self._enter(f"starting {workers} workers and loading the model", now)

    def observe(self, status: JobStatus | None, now: float) -> None:
        if self.done or status is None:
            return
        if status.step > 0 or status.phase not in ("starting", "eval"):
            self._enter(None, now)
            self.done = True
        elif status.phase == "eval":
            self._enter("baseline evaluation", now)
        else:
            self._enter("waiting for the rollout workers", now)

    def _enter(self, phase: str | None, now: float) -> None:
        if phase == self.phase:
            return
        if self.phase is not None:
            self.emit(f"{self.phase}: done in {format_duration(now - self.since)}")
        if phase is not None:
            self.emit(f"{phase} ...")
        self.phase, self.since = phase, now
