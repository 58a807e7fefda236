"""Off a terminal `dverl run` prints every step once, in order, each evaluation under the step it was
taken on, and start-up phases with their durations, read from the run folder as the learner writes it,
however rarely the supervisor polls."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from tqdm import tqdm

from decentralized_verl.core.status import JobStatus
from decentralized_verl.launch.progress_display import show_status
from decentralized_verl.launch.step_lines import JsonlTail, StartupPhases, StepLines
from decentralized_verl.reporting.metrics import MetricsLog
from tests.support.paths import ROOT


def _step(log: MetricsLog, step: int, **extra) -> None:
    log.write(
        {"time": 100.0 + 2 * step, "step": step, "reward_mean": step / 10, "tokens_per_second": 50, **extra}
    )


def _eval(log: MetricsLog, step: int, accuracy: float) -> None:
    log.write_eval(
        {"step": step, "eval_accuracy": accuracy, "eval_accuracy_low": accuracy - 0.1,
         "eval_accuracy_high": accuracy + 0.1, "eval_problems": 20}
    )  # fmt: skip


def test_every_step_is_printed_once_however_few_the_polls(tmp_path: Path) -> None:
    out = io.StringIO()
    lines = StepLines(tmp_path, total=200, out=out)
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        _eval(log, 0, 0.25)
        for step in range(1, 121):
            _step(log, step)
            if step % 50 == 0:
                _eval(log, step, 0.5)
            if step % 37 == 0:  # the supervisor polls rarely: many steps end between two polls
                lines.show(JobStatus(step=step, total_steps=200), 0.0)
        for step in range(121, 201):
            _step(log, step)
        _eval(log, 200, 0.75)
    lines.catch_up()
    printed = out.getvalue().splitlines()
    steps = [line for line in printed if line.startswith("step ")]
    assert [int(line.split()[1].split("/")[0]) for line in steps] == list(range(1, 201))
    evals = [i for i, line in enumerate(printed) if line.startswith("eval ")]
    assert [printed[i].split(":")[0] for i in evals] == [
        "eval step 0", "eval step 50", "eval step 100", "eval step 200"]  # fmt: skip
    for i in evals[1:]:  # each evaluation right under the line of the step it was taken on
        at = printed[i].split(":")[0].split()[-1]
        assert printed[i - 1].startswith(f"step {at}/200")
    assert printed[evals[0]] == "eval step 0: accuracy 25.0% [15.0-35.0] on 20 problems"
    assert printed[evals[0] + 1].startswith("step 1/200 reward 0.100 tok/s 50")
    assert "eta 0s" in steps[-1] and "eta 6m36s" in steps[1]  # 2 s a step, 198 to go


def test_an_evaluation_written_before_its_step_waits_for_the_step(tmp_path: Path) -> None:
    out = io.StringIO()
    lines = StepLines(tmp_path, total=4, out=out)
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        _step(log, 1)
        _eval(log, 2, 0.5)
        lines.show(None, 0.0)
        _step(log, 2)
    lines.catch_up()
    assert [line.split(":")[0].split(" reward")[0] for line in out.getvalue().splitlines()] == [
        "step 1/4", "step 2/4", "eval step 2"]  # fmt: skip


def test_log_every_prints_every_nth_step_the_last_and_every_evaluation(tmp_path: Path) -> None:
    out = io.StringIO()
    lines = StepLines(tmp_path, total=23, every=10, out=out)
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        for step in range(1, 24):
            _step(log, step, reward_errors=3 if step == 20 else 0)
            if step == 7:
                _eval(log, 7, 0.5)
    lines.catch_up()
    said = out.getvalue().splitlines()
    printed = [
        line.split(" reward ")[0].split(":")[0] for line in said if not line.startswith("reward error")
    ]
    assert printed == ["eval step 7", "step 10/23", "step 20/23", "step 23/23"]
    assert said[2].endswith("reward_errors 3") and said[3].startswith("reward error at step 20")


def test_a_file_rewritten_shorter_by_a_resume_is_read_again_without_repeating(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.new_rows()] == [1, 2, 3]
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2')  # rewritten; a line half-written
    assert [r["step"] for r in tail.new_rows()] == [1]
    with path.open("a") as file:
        file.write("}\n")
    assert [r["step"] for r in tail.new_rows()] == [2]


def test_startup_phases_are_announced_with_the_time_each_took() -> None:
    said: list[str] = []
    phases = StartupPhases(said.append)
    phases.begin(3, 0.0)
    phases.observe(None, 5.0)  # the learner is still loading its model: no answer yet
    phases.observe(JobStatus(phase="starting"), 23.0)
    phases.observe(JobStatus(phase="starting"), 24.0)
    phases.observe(JobStatus(phase="eval"), 30.0)
    phases.observe(JobStatus(phase="rollout"), 44.0)
    phases.observe(JobStatus(step=1, phase="idle"), 50.0)
    assert said == [
        "starting 3 workers and loading the model ...",
        "starting 3 workers and loading the model: done in 23s",
        "waiting for the rollout workers ...",
        "waiting for the rollout workers: done in 7s",
        "baseline evaluation ...",
        "baseline evaluation: done in 14s",
    ]


def test_the_barshow_statuss_kl_only_when_the_job_measures_it() -> None:
    shown = io.StringIO()
    bar = tqdm(total=10, file=shown, disable=False, dynamic_ncols=False, ncols=200)
    status = JobStatus(step=3, total_steps=10, phase="rollout", reward_mean=0.5, tokens_per_second=100)
    show_status(bar, status, None)  # no KL in the metrics: not measured
    assert "kl=" not in shown.getvalue() and "reward=0.500" in shown.getvalue()
    show_status(bar, status, 0.0123)
    assert "kl=0.0123" in shown.getvalue()
    bar.close()


def test_the_readmeshow_statuss_the_lines_dverl_run_prints() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Try it: the tiny job") :]
    block = section[
        section.index("```console") + len("```console") : section.index(
            "```", section.index("```console") + 10
        )
    ]
    formats = [
        r"starting \d+ workers and loading the model \.\.\.",
        r"starting \d+ workers and loading the model: done in \d+s",
        r"baseline evaluation \.\.\.",
        r"baseline evaluation: done in \d+s",
        r"eval step \d+: accuracy \d+\.\d% \[\d+\.\d-\d+\.\d\] on \d+ problems",
        r"step \d+/200 reward \d\.\d{3} tok/s \d+ eta (\?|\S+)",
    ]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines and all(any(re.fullmatch(f, line) for f in formats) for line in lines), lines
