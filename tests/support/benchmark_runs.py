"""Running a benchmark script as a real subprocess at tiny sizes, and what the tiny-smoke model must count."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import BENCHMARKS, ROOT

# tiny-smoke by hand: 2 layers x (attention 4*64*64 + MLP 3*64*128 + 2 norms of 64) + embedding and
# untied lm_head 2*104*64 + final norm 64; every first dimension is even, so two shards are equal halves.
TINY_SMOKE_PARAMS = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 104 * 64 + 64
assert TINY_SMOKE_PARAMS == 95_552


def run_benchmark(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """One thread per process, as on a CI core; output captured for the assertion messages."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=str(ROOT),
    )
