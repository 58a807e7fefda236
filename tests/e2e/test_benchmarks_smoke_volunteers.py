"""`benchmarks/volunteers.py --smoke` runs and reports numbers that make sense."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.paths import ROOT


def test_volunteers_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "volunteers.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    tiny = report["models"]["tiny"]
    join = tiny["join"]
    assert join["bytes"] >= 4 * tiny["parameters"] * 0.9  # float32 weights arrived whole
    assert 0 < join["join_s"] < join["total_s"] and join["weights_s"] > 0
    rates = tiny["verify"]["rates"]
    assert [rates[r]["checked"] for r in ("0.05", "0.2", "1")] == [1, 2, 8]  # ceil(rate * 8)
    assert all(rates[r]["check_s"] > 0 for r in rates)
