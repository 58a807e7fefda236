"""A short seeded chaos run (CI's version of benchmarks/chaos.py): kill each role once, rollout, reward,
reference and the learner, while `dverl run` trains; the job completes, every step has exactly one metrics
row, and every sample of every step was answered exactly once.

Here the jobs that train end to end; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import chaos


@pytest.mark.timeout(900)
def test_killing_each_role_once_loses_nothing(tmp_path: Path) -> None:
    steps = 12
    job = chaos.tiny_job(tmp_path, "chaos", steps, seed=3)
    faults = chaos.every_role_once(steps)
    report = chaos.run_chaos(job, tmp_path / "run", faults, timeout=800)
    assert report.completed, (tmp_path / "run.log").read_text()[-3000:]
    assert [r.fault.role for r in report.faults] == ["rollout", "reward", "reference", "learner"]
    assert report.rows_missing == [] and report.rows_repeated == [] and report.steps == steps
    assert report.samples_lost == 0 and report.samples_duplicated == 0
    assert report.learner_restarts == 1
    assert all(r.recovered_s is not None for r in report.faults[:-1])  # each fault was followed by steps
