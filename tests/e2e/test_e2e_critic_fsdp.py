"""End to end with a sharded critic: `dverl run` of the tiny PPO job whose critic is one value model split
over two FSDP2 ranks (gloo) completes, the critic trains every step, and it persists as sharded (DCP)
checkpoints written by both ranks; a killed critic rank's gang restarts and resumes from them."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.processes import held, learner_step, wait_for_step
from tests.support.secured_cluster import secured_cluster

STEPS = 6


def test_ppo_with_a_critic_sharded_over_two_ranks_completes(tmp_path: Path) -> None:
    job = e2e_manifest(
        tmp_path,
        "critic-fsdp",
        **{
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2},
            "roles.critic": {"replicas": 2, "sharding": "fsdp"},
            "roles.rollout": {"replicas": 1, "batchSize": 8},
            "training.steps": STEPS,
            "training.batchSize": 8,
            "training.evalEvery": 0,
            "training.criticLearningRate": 3.0e-3,
        },
    )
    run_job(job, tmp_path / "run", progress=False, timeout=300)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(0 <= r["critic_loss"] < 1 and "advantage_abs_mean" in r for r in records)
    root = tmp_path / "run" / "critic-fsdp-critic-0" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [f"checkpoint-{STEPS - 1}", f"checkpoint-{STEPS}"]
    saved = json.loads((root / f"checkpoint-{STEPS}" / "sharded.json").read_text())
    assert saved["world_size"] == 2 and saved["kind"] == "fsdp"
    assert len(list((root / f"checkpoint-{STEPS}" / "dcp").glob("*.distcp"))) == 2


def test_a_sharded_critic_gang_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    """A killed critic rank takes its gang down: both ranks start again on a fresh rendezvous port (what
    `dverl run` and the operator do for restartRole), rank 0 resumes from the newest sharded checkpoint,
    and the learner's critic calls wait for it and carry on."""
    path = e2e_manifest(
        tmp_path,
        "critic-gang",
        **{
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2},
            "roles.critic": {"replicas": 2, "sharding": "fsdp"},
            "roles.rollout": {"replicas": 1, "batchSize": 8},
            "training.steps": 8,
            "training.batchSize": 8,
            "training.evalEvery": 0,
        },
    )
    output = tmp_path / "run"
    cluster, _ = secured_cluster(path, output)
    learner = cluster.by_role("learner")[0]
    first, second = cluster.by_role("critic")
    port = cluster.dist_ports["critic"]
    with cluster:
        cluster.start()
        # The learner is held from its own step-3 line while the gang goes down and is started again, so
        # the kill lands mid-run however fast the job trains.
        wait_for_step(learner.log_path, 3, timeout=300, alive=learner.alive)
        with held(learner.process.pid):
            killed_at = learner_step(learner.log_path)
            cluster.kill(second.worker.name, signal.SIGKILL)
            second.process.wait()
            cluster.restart_gang("critic")
        assert learner.process.wait(timeout=300) == 0, learner.log_tail()
    assert 3 <= killed_at < 8 and first.restarts == second.restarts == 1
    assert cluster.dist_ports["critic"] != port
    assert re.search(r"restored after \d+ updates", first.log_path.read_text()), first.log_tail()
    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9))
    assert all(0 <= r["critic_loss"] < 1 for r in records)
