"""`benchmarks/async_overlap.py --smoke`: both k run for real and the report is consistent with them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT


@pytest.mark.timeout(900)
def test_async_overlap_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "async_overlap.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=880,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    on_policy, overlapped = report["summary"]["0"], report["summary"]["1"]
    assert on_policy["max_staleness_seen"] == 0  # k = 0 is strictly on-policy
    assert overlapped["max_staleness_seen"] == 1  # k = 1 did overlap generation with the update
    for s in (on_policy, overlapped):
        assert s["step_s_median"] > 0 and s["wall_s"] > s["step_s_median"]
        assert 0.0 <= s["reward_last10"] <= 1.0 and 0.0 <= s["eval_accuracy"] <= 1.0
        assert not math.isnan(s["eval_accuracy"])
    assert "Overlap gain" in out.stderr
