"""Refit parity in a real job: after every weight refresh the rollout's log-probs are compared with the
learner's on the same tokens. A healthy job (`dverl run`, remote rollout workers, signed weights) measures
differences at the engines' numerics every step and finishes; the same job whose rollout workers load a
deliberately corrupted refresh fails loudly, naming the rollout worker, the learner and the version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from decentralized_verl.launch.run_status import render_status, run_status
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.paths import ROOT

CORRUPT = ROOT / "tests" / "support" / "corrupt_refresh"
JOB = {
    "roles.rollout": {"replicas": 1, "batchSize": 16},
    "training.steps": 3,
    "training.evalEvery": 0,
    "training.refitParityBound": 0.01,
}


def dverl_run(manifest: Path, output: Path, *, corrupt: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "DVERL_CPUS": "2"}
    if corrupt:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CORRUPT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", "run", str(manifest), "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=str(ROOT),
    )


def test_a_healthy_refresh_is_measured_every_step_and_passes(tmp_path: Path) -> None:
    manifest = e2e_manifest(tmp_path, "parity-ok", **JOB)
    done = dverl_run(manifest, tmp_path / "run", corrupt=False)
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:  # the same fp32 weights on both sides: differences are rounding only
        assert 0 <= r["refit_logprob_diff_mean"] <= r["refit_logprob_diff_max"] < 1e-3, r
        assert r["refit_parity_tokens"] > 0
    shown = render_status(run_status(tmp_path / "run"))
    assert "refit parity: rollout vs learner log-probs differ by" in shown, shown


def test_a_corrupted_refresh_fails_the_job_naming_both_workers_and_the_version(tmp_path: Path) -> None:
    manifest = e2e_manifest(tmp_path, "parity-bad", **JOB)
    done = dverl_run(manifest, tmp_path / "run", corrupt=True)
    assert done.returncode != 0, done.stdout + done.stderr
    said = done.stderr
    assert "refit parity failed after the refresh to policy version 1" in said, said
    assert "rollout parity-bad-rollout-0" in said and "learner parity-bad-learner-0" in said, said
    assert "over training.refitParityBound 0.01" in said, said
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # step 1 generated with the weights every worker started from; step 2 with the corrupted refresh
    assert records[0]["refit_logprob_diff_mean"] < 1e-3
    assert records[-1]["step"] == 2 and records[-1]["refit_logprob_diff_mean"] > 0.01
    learner_log = (tmp_path / "run" / "logs" / "parity-bad-learner-0.log").read_text()
    assert learner_log.count("refit parity failed") == 1  # failed once, never restarted to fail again
