"""Smoke runs of the fast-path benchmarks (grpo_vs_trl, learner_mfu, cpu_kernels, cpu_sharing,
time_to_accuracy) at tiny sizes.

Each script runs as a real subprocess and its JSON report is checked against what the sizes imply
(hand-counted FLOPs, budgets, curves). TRL's side, installed with the dev extras, runs too: a `trl`
that does not import fails its tests.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.benchmark_runs import run_benchmark as run
from tests.support.paths import BENCHMARKS as BENCH

sys.path.insert(0, str(BENCH))


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("grpo_vs_trl.py", ["--steps", "0"], "--steps: must be >= 1"),
        (
            "grpo_vs_trl.py",
            ["--prompts", "3", "--microbatch-prompts", "2"],
            "multiple of --microbatch-prompts",
        ),
        ("learner_mfu.py", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("grpo_vs_trl.py", ["--ours-microbatch-tokens", "0"], "--ours-microbatch-tokens: must be >= 1"),
        ("learner_mfu.py", ["--shared-microbatch-tokens", "0"], "--shared-microbatch-tokens: 'plain' or"),
        ("time_to_accuracy.py", ["--budget", "-1"], "--budget: must be > 0"),
        ("grpo_vs_trl.py", ["--shots", "0"], "--shots: must be >= 1"),
        ("cpu_kernels.py", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("time_to_accuracy.py", ["--target", "1.5"], "--target: must be in (0, 1]"),
    ],
)
def test_bad_arguments_exit_2(script: str, args: list[str], message: str) -> None:
    out = run(script, *args, timeout=60)
    assert out.returncode == 2 and message in out.stderr
