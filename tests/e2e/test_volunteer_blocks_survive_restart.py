"""A block outlives the learner: a live volunteer job (bootstrap, learner and volunteers as separate
processes talking only through the DHT and P2P) catches a cheating volunteer and blocks it; the learner
is SIGKILLed and started again with `--resume`; the cheater comes back with the same join token and is
refused, while a fresh honest volunteer joins and the job finishes with every step once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from netlab.jobs import dht_argv, learner_argv
from netlab.manifests import volunteer_job

from tests.e2e.test_volunteers_e2e import SECRET, Procs, learner_folder, token, volunteer_cmd
from tests.support.job_manifests import TOY
from tests.support.processes import ProcessGroup, free_port

pytestmark = pytest.mark.usefixtures("collected_before_fork")

STEPS = 4


@pytest.fixture
def procs(tmp_path: Path):
    p = Procs(tmp_path)
    yield p
    p.close()


def _learner_env(tmp_path: Path, job: str, maddr: str, wait: int) -> dict[str, str]:
    return {
        "DVERL_TLS_DIR": str(learner_folder(tmp_path, job)),
        "DVERL_DHT_ADDR": maddr,
        "DVERL_JOIN_SECRET": SECRET,
        "DVERL_WAIT_VOLUNTEERS": f"{wait}:180",
        "DVERL_VOLUNTEER_POLL_S": "0.5",
    }


def _admission(out: Path) -> dict:
    path = out / "volunteer_admission.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_blocked_volunteer_stays_blocked_after_a_learner_restart(procs: Procs, tmp_path: Path) -> None:
    job = "vol-restart"
    config = volunteer_job(
        tmp_path,
        job,
        TOY / "train.jsonl",
        **{
            "training.steps": STEPS,
            "training.checkpoint": {"every": 1, "dir": "checkpoints"},
            "volunteers.verifyFraction": 1.0,
        },
    )
    procs.start("dht", dht_argv(job, free_port(), "127.0.0.1"))
    maddr = procs.wait_for("dht", r"--initial-peers (\S+)").group(1)
    out = tmp_path / "run"
    procs.start("learner", learner_argv(config, free_port(), out), _learner_env(tmp_path, job, maddr, 2))
    cheat_token = token(job)
    procs.start("honest", volunteer_cmd(maddr, job, token(job), "slow"))  # steps of seconds: time to kill
    procs.start("cheat", volunteer_cmd(maddr, job, cheat_token, "cheat", "logprobs", "0.5"))
    cheat_peer = procs.wait_for("cheat", r"volunteer (\S+) joined", 180).group(1)

    deadline = time.monotonic() + 240
    while cheat_peer not in _admission(out).get("blocked", {}) or not any(
        out.glob("checkpoints/checkpoint-*/trainer_state.json")
    ):
        assert procs.procs["learner"].poll() is None, procs.log("learner")[-3000:]
        assert time.monotonic() < deadline, procs.log("learner")[-3000:]
        time.sleep(0.2)
    assert procs.procs["learner"].poll() is None, "the learner finished before it could be killed"
    os.killpg(procs.procs["learner"].pid, signal.SIGKILL)
    procs.procs["learner"].wait(30)
    for name in ("cheat", "honest"):
        procs.stop(name)

    argv = [*learner_argv(config, free_port(), out), "--resume"]
    procs.start("learner2", argv, _learner_env(tmp_path, job, maddr, 1))
    ProcessGroup.wait_for(procs, "learner2", r"volunteer admission taken up from", 240)
    procs.start("cheat2", volunteer_cmd(maddr, job, cheat_token))  # same token, fresh identity
    assert procs.procs["cheat2"].wait(180) == 2, procs.log("cheat2")[-3000:]
    assert "this join token is blocked" in procs.log("cheat2"), procs.log("cheat2")[-3000:]
    procs.start("honest2", volunteer_cmd(maddr, job, token(job)))
    assert procs.procs["learner2"].wait(300) == 0, procs.log("learner2")[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    report = json.loads((out / "volunteers.json").read_text())
    assert cheat_peer in report["blocked"]
