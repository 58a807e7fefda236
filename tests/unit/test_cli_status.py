"""`dverl status RUN_DIR`: a run folder's step, reward, ETA, workers and last evaluation, as text or JSON."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from decentralized_verl.cli.main import main
from decentralized_verl.launch.run_record import end_record, process_start_time, recorded_state, start_record
from decentralized_verl.reporting.metrics import MetricsLog


def _run_folder(tmp_path: Path, steps: int, finished: bool) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    for name in ("job-learner-0", "job-rollout-0", "job-rollout-1"):
        (run / "logs" / f"{name}.log").write_text("")
    (run / "job.yaml").write_text(yaml.safe_dump({"spec": {"training": {"steps": 10}}}))
    with MetricsLog(run / "metrics.jsonl") as log:
        for step in range(1, steps + 1):
            log.write(
                {"time": 1000.0 + 2 * step, "step": step, "reward_mean": step / 10, "rollout_workers": 2}
            )
        log.write_eval(
            {
                "step": 0,
                "eval_accuracy": 0.25,
                "eval_accuracy_low": 0.1,
                "eval_accuracy_high": 0.4,
                "eval_problems": 20,
            }
        )
    if finished:
        (run / "summary.json").write_text(json.dumps({"steps": steps, "last_checkpoint": "ck/step-10"}))
    return run


def test_status_of_a_run_in_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    assert main(["status", str(run)]) == 0
    text = capsys.readouterr().out
    assert "running, step 4/10" in text
    assert "reward 0.400" in text
    assert "eta 12s" in text  # 2 s a step, 6 steps left
    assert "workers 3: job-learner-0, job-rollout-0, job-rollout-1 (2 rollout serving" in text
    assert "last eval (step 0): accuracy 25.0% [10.0-40.0] on 20 problems" in text
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["step"] == 4 and status["total_steps"] == 10 and status["eta_seconds"] == pytest.approx(12)
    assert status["state"] == "running" and status["last_eval"]["eval_accuracy"] == 0.25


def test_watch_stops_when_the_run_finishes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_folder(tmp_path, steps=10, finished=True)
    assert main(["status", "--watch", "0.1", "--json", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["state"] == "finished"
    assert json.loads(lines[0])["last_checkpoint"] == "ck/step-10"


def test_status_of_a_folder_that_is_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def _record(run: Path, **fields) -> None:
    """The `run.json` a `dverl run` on this machine left, with `fields` over those of this process."""
    record = {"state": "running", "pid": os.getpid(), "pid_started": process_start_time(os.getpid())}
    (run / "run.json").write_text(json.dumps({**record, "host": socket.gethostname(), **fields}))


def test_a_run_whose_supervisor_lives_is_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    _record(run)
    assert main(["status", "--json", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "running"


@pytest.mark.parametrize(
    "gone",
    [{"pid": 2**22 + 7}, {"pid_started": "0"}],  # no such process; the pid now names another process
    ids=["dead", "pid-reused"],
)
def test_a_run_whose_processes_are_gone_is_interrupted_and_watch_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gone: dict
) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    _record(run, **gone)
    assert main(["status", "--watch", "0.1", str(run)]) == 0  # returns at once rather than watching forever
    text = capsys.readouterr().out
    assert "interrupted, step 4/10" in text and "is gone" in text and "eta" not in text
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "interrupted" and status["eta_seconds"] is None


@pytest.mark.parametrize(
    ("state", "detail"), [("failed", "learner exited with code 1"), ("interrupted", "stopped by Ctrl-C")]
)
def test_a_run_that_ended_says_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str, detail: str
) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    _record(run, state=state, detail=detail)
    assert main(["status", "--watch", "0.1", str(run)]) == 0
    assert f"{state}, step 4/10 ({detail})" in capsys.readouterr().out


def test_a_record_from_another_machine_leaves_the_files_to_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    _record(run, host="some-other-host.invalid", pid=2**22 + 7)
    assert main(["status", "--json", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "running"  # its pid means nothing here


def test_the_record_dverl_run_writes_reads_back_as_running_then_as_its_end(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, steps=4, finished=False)
    start_record(run)
    assert recorded_state(run) == ("running", "")
    end_record(run, "failed", "worker job-rollout-0 exited with code 1")
    assert recorded_state(run) == ("failed", "worker job-rollout-0 exited with code 1")
