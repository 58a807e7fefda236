"""Smoke runs of the fast-path benchmarks (grpo_vs_trl, learner_mfu, cpu_kernels, cpu_sharing,
time_to_accuracy) at tiny sizes.

Each script runs as a real subprocess and its JSON report is checked against what the sizes imply
(hand-counted FLOPs, budgets, curves). TRL's side, installed with the dev extras, runs too: a `trl`
that does not import fails its tests.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import BENCHMARKS as BENCH
from tests.support.paths import ROOT

sys.path.insert(0, str(BENCH))


# tiny-smoke by hand: 2 layers x (attention 4*64*64 + MLP 3*64*128 + 2 norms of 64) + embedding and
# untied lm_head 2*104*64 + final norm 64.
TINY_SMOKE_PARAMS = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 104 * 64 + 64
assert TINY_SMOKE_PARAMS == 95_552


def run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=str(ROOT),
    )


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
