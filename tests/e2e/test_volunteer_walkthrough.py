"""The README's volunteer walk-through, command for command on one machine: make the job's secret, start
the job, issue a token, start a volunteer at the address the job printed, and see the volunteer's samples
counted in a step. The job is the tiny volunteer job instead of SmolLM2's; every command is the README's.
Also what a volunteer says when there is no job to join, and what `dverl token` says with no secret."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from netlab.manifests import volunteer_job

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import TOY
from tests.support.paths import ROOT
from tests.support.processes import console_env

JOB = "volunteer-grpo"
"""The README's job name; the manifest here is the tiny volunteer job under that name."""


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Volunteers over a DHT") :]
    return section[section.index("```bash") : section.index("```", section.index("```bash") + 7)]


def _readme_commands() -> list[str]:
    """The walk-through's commands as the README writes them (comments dropped, continuations joined)."""
    joined = _readme_block().replace("```bash", "").replace("\\\n", " ")
    lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
    return [re.sub(r"\s+", " ", line) for line in lines if line and not line.startswith("#")]


def _shell(command: str, cwd: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=console_env(),
            start_new_session=True,
        )  # fmt: skip


def _wait(predicate, what: str, timeout: float, *alive: tuple[subprocess.Popen, Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := predicate()) is not None:
            return found
        for proc, log in alive:
            assert proc.poll() is None, f"{log.name} ended before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {what} in {timeout:g}s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # bash -c execs the last command: the signal reaches dverl
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(900)
def test_the_readme_volunteer_walkthrough_works_command_for_command(tmp_path: Path) -> None:
    make_secret, run_job, issue, join = _readme_commands()
    assert make_secret == "openssl rand -hex 32 > job-secret"
    assert run_job == f"DVERL_JOIN_SECRET_FILE=job-secret dverl run examples/{JOB}.yaml"
    assert issue == f"dverl token --job {JOB} --secret-file job-secret > join-token"
    assert join.startswith("dverl worker --initial-peers /ip4/<host>/tcp/<port>/p2p/<peer-id> ")
    assert join.endswith(f'--job {JOB} --token "$(cat join-token)" --role rollout')

    (tmp_path / "examples").mkdir()
    volunteer_job(tmp_path / "examples", JOB, TOY / "train.jsonl", **{"training.steps": 300})
    assert subprocess.run(["bash", "-c", make_secret], cwd=tmp_path, env=console_env()).returncode == 0
    job_log, volunteer_log = tmp_path / "job.log", tmp_path / "volunteer.log"
    job = _shell(run_job, tmp_path, job_log)
    volunteer = None
    try:
        printed = re.compile(
            r"volunteers join this job while it runs with: dverl worker --initial-peers (\S+)"
        )
        said = _wait(
            lambda: printed.search(job_log.read_text()), "join line from the job", 300, (job, job_log)
        )
        assert subprocess.run(["bash", "-c", issue], cwd=tmp_path, env=console_env()).returncode == 0
        address = said.group(1)
        volunteer = _shell(
            join.replace("/ip4/<host>/tcp/<port>/p2p/<peer-id>", address), tmp_path, volunteer_log
        )
        metrics = tmp_path / "runs" / JOB / "metrics.jsonl"
        step = _wait(
            lambda: next((r for r in read_metrics(metrics)
                          if any(w.startswith("volunteer-") for w in r.get("samples_by_worker", {}))), None),
            "step with a volunteer's samples", 400, (job, job_log), (volunteer, volunteer_log),
        )  # fmt: skip
        counted = {w: n for w, n in step["samples_by_worker"].items() if w.startswith("volunteer-")}
        assert sum(counted.values()) > 0 and step["samples"] == step["expected_samples"]
    finally:
        if volunteer is not None:
            _stop(volunteer)
        _stop(job)


@pytest.mark.timeout(300)
def test_a_volunteer_with_no_job_running_says_so_and_exits(tmp_path: Path) -> None:
    (tmp_path / "job-secret").write_text("0123456789abcdef0123456789abcdef\n")
    token = subprocess.run(
        ["dverl", "token", "--job", JOB, "--secret-file", "job-secret"], cwd=tmp_path, env=console_env(),
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    gone = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWCkBiJd7rAJoJPzdEgwk1ExUvcMi9VivUSFc8yR1Kh5RG"  # nothing listens
    worker = subprocess.run(
        ["dverl", "worker", "--initial-peers", gone, "--job", JOB, "--token", token, "--role", "rollout"],
        cwd=tmp_path, env=console_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert worker.returncode == 1, worker.stderr[-2000:]
    assert f"no bootstrap peer of job '{JOB}' answered at {gone}" in worker.stderr
    assert "a volunteer joins a running job" in worker.stderr and "Traceback" not in worker.stderr


def test_dverl_token_without_a_secret_says_how_to_make_one(tmp_path: Path) -> None:
    result = subprocess.run(
        ["dverl", "token", "--job", JOB, "--secret-file", "job-secret"], cwd=tmp_path, env=console_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "job-secret: no such file" in result.stderr and "openssl rand -hex 32 > job-secret" in result.stderr
    )
