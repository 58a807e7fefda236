"""The operator's pure core: children, the reconcile decision, status helpers, Lease arithmetic, flags.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys


def test_operator_import_path_stays_free_of_torch():
    code = (
        "import sys, dverl_operator.main, dverl_operator.handlers; "
        "print(sorted({'torch','transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_operator_without_credentials_exits_2(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = [
        sys.executable,
        "-m",
        "dverl_operator",
        "--all-namespaces",
        "--metrics-port",
        "0",
        "--liveness-port",
        "0",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "no Kubernetes credentials" in result.stderr
