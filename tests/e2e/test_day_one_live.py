"""A new user's first jobs, as `dverl run` shows them off a terminal (a pipe, CI): every step's line and
each evaluation under its step, start-up phases with their durations; the run folder kept from being
written over; `dverl status` telling finished, failed and interrupted runs apart; and a reward function
that raises counted, said once, and stopping the job with exit 2 naming it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.paths import ROOT
from tests.support.processes import console_env, dverl

OPTIONAL = ("samples.jsonl", "tensorboard/", "mlruns/", "wandb/", "plots/*.png")
"""Run-folder entries only some jobs write (samples every N steps, trackers) or only `dverl plot` does."""


def _documented_run_files() -> list[str]:
    text = (ROOT / "docs" / "running.md").read_text()
    table = text[text.index("## The run folder") :].split("\n## ")[0]
    names = [
        n
        for line in table.splitlines()
        if line.startswith("| `")
        for n in re.findall(r"`([^`]+)`", line.split("|")[1])
    ]
    return [n.replace("<worker>.log", "").replace("checkpoint-N/", "") for n in names if n not in OPTIONAL]


SMALL = {"roles.rollout": {"replicas": 1, "batchSize": 16}, "training.batchSize": 8}


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`dverl run ...` with its stderr a pipe, as CI or `2> log` gives it."""
    return subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", "run", *args],
        capture_output=True, text=True, timeout=timeout, env=console_env(),
    )  # fmt: skip


@pytest.mark.timeout(900)
def test_a_first_run_off_a_terminal_then_the_folder_is_kept(tmp_path: Path) -> None:
    job = e2e_manifest(tmp_path, "day-one", **{**SMALL, "training.steps": 4, "training.evalEvery": 2})
    out = tmp_path / "run"
    first = _run(str(job), "--output", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    said = first.stderr.splitlines()
    steps = [line for line in said if re.match(r"step \d+/4 ", line)]
    assert [int(line.split()[1].split("/")[0]) for line in steps] == [1, 2, 3, 4], first.stderr
    evals = [i for i, line in enumerate(said) if line.startswith("eval step ")]
    assert [said[i].split(":")[0] for i in evals] == ["eval step 0", "eval step 2", "eval step 4"]
    assert said[evals[1] - 1].startswith("step 2/4") and said[evals[2] - 1].startswith("step 4/4")
    assert said[0] == "starting 2 workers and loading the model ..."
    assert any(re.fullmatch(r"starting 2 workers and loading the model: done in \d+s", s) for s in said)
    # Every phase announced is closed with its duration before step 1 (a baseline evaluation shorter than
    # one status poll may pass unannounced; its result line is there either way, before step 1).
    first_step = said.index(steps[0])
    opened = [line[: -len(" ...")] for line in said[:first_step] if line.endswith(" ...")]
    for phase in opened:
        assert any(re.fullmatch(rf"{re.escape(phase)}: done in \d+s", s) for s in said[:first_step]), said
    assert evals[0] < first_step, said
    status = dverl("status", "--json", str(out))
    assert json.loads(status.stdout)["state"] == "finished"
    for name in _documented_run_files():  # docs/running.md's run folder, as a run leaves it
        assert (out / name).exists(), f"docs/running.md names {name}, which this run folder lacks"

    before = (out / "metrics.jsonl").read_text()
    again = _run(str(job), "--output", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr and "--resume" in again.stderr
    assert (out / "metrics.jsonl").read_text() == before  # nothing of the first run was touched
    resumed = _run(str(job), "--output", str(out), "--resume")
    assert resumed.returncode == 2 and "already finished all 4 steps" in resumed.stderr
    assert "step 1/4" not in resumed.stderr and (out / "metrics.jsonl").read_text() == before
    missing = _run(str(job), "--output", str(tmp_path / "nowhere"), "--resume")
    assert missing.returncode == 2 and "there is no run to continue" in missing.stderr


@pytest.mark.timeout(900)
def test_a_reward_that_raises_is_counted_said_once_and_stops_the_job(tmp_path: Path) -> None:
    (tmp_path / "broken_reward.py").write_text(
        "def score(completion, reference, prompt=None):\n    return {'answer': 1}['score']\n"
    )
    job = e2e_manifest(
        tmp_path,
        "broken-reward",
        **{**SMALL, "training.steps": 20, "training.evalEvery": 0, "data.rewardType": "broken_reward:score",
           "data.rewardErrorSteps": 2},
    )  # fmt: skip
    out = tmp_path / "run"
    run = _run(str(job), "--output", str(out))
    assert run.returncode == 2, run.stderr[-3000:]
    stopped = next(line for line in run.stderr.splitlines() if line.startswith("error: "))
    assert "data.rewardType broken_reward:score: every reward failed for 2 steps in a row" in stopped
    assert "raised KeyError: 'score'" in stopped
    notices = [line for line in run.stderr.splitlines() if line.startswith("reward error at step")]
    assert len(notices) == 1 and "broken_reward:score raised KeyError" in notices[0], run.stderr
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # stopped, not trained on zeros for 20 steps
    assert all(r["reward_errors"] == r["samples"] > 0 for r in rows)
    learner_log = next((out / "logs").glob("*learner*.log")).read_text()
    assert "on the sample: prompt=" in learner_log and "{'answer': 1}['score']" in learner_log
    status = json.loads(dverl("status", "--json", str(out)).stdout)
    assert status["state"] == "failed" and status["reward_errors_total"] == sum(r["samples"] for r in rows)


@pytest.mark.timeout(900)
def test_status_of_a_run_whose_dverl_run_was_killed_says_interrupted(tmp_path: Path) -> None:
    job = e2e_manifest(tmp_path, "killed", **{**SMALL, "training.steps": 500, "training.evalEvery": 0})
    out = tmp_path / "run"
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "decentralized_verl.cli", "run", str(job), "--output", str(out)],
            stdout=log, stderr=subprocess.STDOUT, env=console_env(), start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not read_metrics(out / "metrics.jsonl") and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(0.2)
        assert json.loads(dverl("status", "--json", str(out)).stdout)["state"] == "running"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no chance to say how it ended
        proc.wait()
    watched = dverl("status", "--watch", "0.2", str(out), timeout=60)  # ends rather than watching forever
    assert watched.returncode == 0 and "interrupted, step" in watched.stdout and "eta" not in watched.stdout
