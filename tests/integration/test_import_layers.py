"""The import contracts in pyproject.toml hold (import-linter, run for real), and they name every package:
a new package or top-level module must be placed in a layer, or declared as standing beside them.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

"""Each package with its own layers contract (its `containers`), and where it lives."""
"""Modules standing outside every layer: the operator's `python -m` entry only (docs/architecture.md)."""


def test_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'worker_image'}{os.pathsep}{ROOT / 'operator'}"}
    done = subprocess.run(
        [str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
