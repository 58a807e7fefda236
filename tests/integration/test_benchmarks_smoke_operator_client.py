"""benchmarks/operator_client_cost.py without its measurement (which installs each client from the package
index into a fresh venv: minutes, so it runs by hand): its size count and its command line.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "operator_client_cost.py"


def test_an_unknown_client_is_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "lightkube", "kubectl"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "unknown client(s) kubectl" in done.stderr
