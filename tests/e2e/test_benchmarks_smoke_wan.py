"""The WAN benchmarks' smoke modes: weight deltas on the tiny model (every delta is applied back and
byte-compared with the full bundle inside the benchmark), and the volunteer job across emulated hosts.

Here the jobs that train end to end; the ones with real processes and servers in tests/integration/, under
the same name.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from netlab.hosts import namespaces_refused

from tests.support.paths import ROOT
from tests.support.processes import console_env


@pytest.mark.skipif(
    namespaces_refused() is not None, reason=f"network namespaces refused: {namespaces_refused()}"
)
@pytest.mark.usefixtures("collected_before_fork")
def test_wan_smoke() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wan.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=console_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout)["home20"]
    assert run["steps"] == 3 and run["samples_lost"] == 0 and run["samples_duplicated"] == 0
    far = run["volunteers"]["v0"]
    assert far["link"] == "home20" and far["accepted_samples"] > 0
    assert far["full"] == 1 and far["deltas"] == 2 and far["delta_bytes_each"] * 5 < far["full_bytes_each"]
