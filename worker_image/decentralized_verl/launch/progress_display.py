"""What `dverl run` shows while a job runs: a bar on a terminal, start-up phases and one line per step in
a pipe, and the Ray cluster's dashboard record when the run has one. Fed by the supervisor's polls."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from decentralized_verl.core.status import JobStatus
from decentralized_verl.launch.step_lines import JsonlTail, RewardErrorNotice, StartupPhases, StepLines


class ProgressDisplay:
    """Where the learner's progress goes on each poll: a bar on a terminal, or start-up phases then one
    line per step (every `every`-th) and each evaluation in a pipe; and the Ray cluster's dashboard when
    the run has one."""

    def __init__(
        self, cluster: Any, job: Any, output: Path, *, bar: bool, lines: bool, every: int = 1
    ) -> None:
        self.cluster = cluster
        self.job = job
        self.want_bar = bar
        self.bar: Any = None
        self.rows = JsonlTail(output / "metrics.jsonl")
        self.errors = RewardErrorNotice()
        self.kl: float | None = None
        total = job.spec.training.steps or 0
        self.printer = StepLines(output, total=total, every=every) if lines else None
        self.startup = StartupPhases(self.say) if lines or bar else None

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def open(self, workers: int, now: float) -> None:
        if self.want_bar:
            self.bar = tqdm(
                total=self.job.spec.training.steps or 0,
                desc=self.job.metadata.name,
                unit="step",
                dynamic_ncols=True,
            )
        if self.startup is not None:
            self.startup.begin(workers, now)
        if hasattr(self.cluster, "publish"):  # the cluster's record knows the run's length before any poll
            self.cluster.publish(total_steps=self.job.spec.training.steps)

    def show(self, status: JobStatus | None, now: float) -> None:
        if self.startup is not None:
            self.startup.observe(status, now)
        if self.printer is not None:
            self.printer.show(status, now)
        if status is None:
            return
        if self.bar is not None:
            rows = self.rows.new_rows()
            for row in rows:
                notice = self.errors.line(row)
                if notice is not None:
                    self.say(notice)
            if rows:
                self.kl = rows[-1].get("kl")
            elif not self.rows.path.exists() and status.kl:
                self.kl = status.kl  # no metrics file here (Ray): a KL that is not 0 was measured
            show_status(self.bar, status, self.kl)
        if hasattr(self.cluster, "publish"):
            # A learner still starting (a restart) answers with no total: the spec's is known from the start.
            total = status.total_steps or self.job.spec.training.steps
            self.cluster.publish(step=status.step, total_steps=total, phase=status.phase)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def catch_up(self) -> None:
        if self.printer is not None:
            self.printer.catch_up()


def show_status(bar: Any, status: JobStatus, kl: float | None) -> None:
    """The bar's numbers; KL only when the job measures it (`kl` None: it does not, so no 0.0000)."""
    if status.total_steps and bar.total != status.total_steps:
        bar.total = status.total_steps
    bar.n = status.step
    numbers = {"phase": status.phase, "reward": f"{status.reward_mean:.3f}"}
    if kl is not None:
        numbers["kl"] = f"{kl:.4f}"
    bar.set_postfix(**numbers, tok_s=f"{status.tokens_per_second:.0f}", refresh=False)
    bar.refresh()
