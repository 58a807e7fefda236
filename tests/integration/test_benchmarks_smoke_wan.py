"""The WAN benchmarks' smoke modes: weight deltas on the tiny model (every delta is applied back and
byte-compared with the full bundle inside the benchmark), and the volunteer job across emulated hosts.

Here the ones with real processes and servers; the jobs that train end to end in tests/e2e/, under the same
name.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import ROOT
from tests.support.processes import console_env


def test_wan_deltas_smoke() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wan_deltas.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=console_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for dtype in ("bfloat16", "float32"):
        row = result["by_lr"]["0.001"][dtype]
        assert 0 < row["delta_bytes"] < row["full_bytes"] and 0 < row["changed_fraction"] <= 1
