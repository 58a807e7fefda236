"""Faults during a real `dverl run` that the chaos CI run does not cover: a rollout worker that hangs while
alive (SIGSTOP), and a resume at another learner count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos


@pytest.mark.timeout(900)
def test_a_rollout_worker_that_hangs_alive_has_its_work_redone(tmp_path: Path) -> None:
    job = chaos.tiny_job(tmp_path, "hang", 10, seed=5)
    faults = [chaos.Fault(3, "rollout", "stop", index=0, hold_s=20.0)]
    report = chaos.run_chaos(job, tmp_path / "run", faults, timeout=800)
    assert report.completed, (tmp_path / "run.log").read_text()[-3000:]
    assert report.rows_missing == [] and report.rows_repeated == []
    assert report.samples_lost == 0 and report.samples_duplicated == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # Its share is hedged on the other worker once far past its usual time (not held to its deadline),
    # and the stopped worker is held out of dispatch until its Health answers again.
    assert sum(r["hedged"] for r in rows) >= 1
    learner_log = (tmp_path / "run" / "logs" / "hang-learner-0.log").read_text()
    assert "share of hang-rollout-0 is late" in learner_log


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_resume_at_another_learner_count_keeps_the_data_order(
    tmp_path: Path, before: int, after: int
) -> None:
    overrides = {
        "training.evalEvery": 0,
        "training.batchSize": 8,
        "training.checkpoint": {"every": 2, "dir": "ckpt"},
        "roles.rollout": {"replicas": 1, "batchSize": 16},
    }
    first = e2e_manifest(
        tmp_path, "world", **{"training.steps": 2, "roles.learner": {"replicas": before}, **overrides}
    )
    run_job(first, tmp_path / "run", progress=False, timeout=600)
    state = json.loads((tmp_path / "run" / "ckpt" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["sampler"] == {"epoch": 0, "offset": 2 * 8 * before}  # 2 steps x 8 prompts x learners
    second = e2e_manifest(
        tmp_path, "world", **{"training.steps": 3, "roles.learner": {"replicas": after}, **overrides}
    )
    summary = run_job(second, tmp_path / "run", resume=True, progress=False, timeout=600)
    assert summary["steps"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    state = json.loads((tmp_path / "run" / "ckpt" / "checkpoint-3" / "trainer_state.json").read_text())
    # the next 8 x learners prompts of the same order (55 toy prompts: one epoch holds all three steps)
    assert state["sampler"] == {"epoch": 0, "offset": 2 * 8 * before + 8 * after}
