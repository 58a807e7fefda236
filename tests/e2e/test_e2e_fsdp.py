"""End to end with sharded learners: `dverl run` of the tiny job with two FSDP2 learner ranks learns, its
rollout worker pulls weights gathered tensor by tensor, its checkpoints are sharded, and the run resumes
from them with one learner rank instead of two."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest


def test_two_fsdp_learners_learn_checkpoint_and_resume_as_one(tmp_path: Path) -> None:
    overrides = {
        "roles.rollout": {"replicas": 1, "batchSize": 16},
        "roles.learner": {"replicas": 2, "sharding": "fsdp"},
        "training.batchSize": 8,
        "training.evalEvery": 0,
        "training.checkpoint": {"every": 10, "dir": "ckpt", "keep": 1},
    }
    first = e2e_manifest(tmp_path, "fsdp-e2e", **{"training.steps": 60, **overrides})
    summary = run_job(first, tmp_path / "run", progress=False, timeout=900)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 61))
    first_mean = statistics.fmean(r["reward_mean"] for r in records[:15])
    last_mean = statistics.fmean(r["reward_mean"] for r in records[-15:])
    assert last_mean > first_mean + 0.1, (first_mean, last_mean)
    assert summary["policy_version"] == 60 and len(summary["replica_digests"]) == 1
    folder = tmp_path / "run" / "ckpt" / "checkpoint-60"
    saved = json.loads((folder / "sharded.json").read_text())
    assert saved["world_size"] == 2 and len(list((folder / "dcp").glob("*.distcp"))) == 2

    one = {**overrides, "roles.learner": {"replicas": 1, "sharding": "fsdp"}, "training.batchSize": 16}
    second = e2e_manifest(tmp_path, "fsdp-e2e", **{"training.steps": 63, **one})
    summary = run_job(second, tmp_path / "run", resume=True, progress=False, timeout=600)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 64))
    assert summary["policy_version"] == 63
    assert statistics.fmean(r["reward_mean"] for r in records[-3:]) > first_mean
