"""A short seeded chaos run (CI's version of benchmarks/chaos.py): kill each role once, rollout, reward,
reference and the learner, while `dverl run` trains; the job completes, every step has exactly one metrics
row, and every sample of every step was answered exactly once.

Here the pure checks; the jobs that train end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import sys

from tests.support.paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import chaos


def test_the_fault_plan_is_seeded_and_spread_over_the_run() -> None:
    assert chaos.plan_faults(20, 60, seed=1) == chaos.plan_faults(20, 60, seed=1)
    plan = chaos.plan_faults(20, 60, seed=1)
    assert len(plan) == 20 and all(2 <= f.at_step <= 58 for f in plan)
    assert {f.role for f in plan} == set(chaos.ROLES) and {f.kind for f in plan} == set(chaos.KINDS)
    assert [f.at_step for f in plan] == sorted(f.at_step for f in plan)
