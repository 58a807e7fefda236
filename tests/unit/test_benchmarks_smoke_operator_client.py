"""benchmarks/operator_client_cost.py without its measurement (which installs each client from the package
index into a fresh venv: minutes, so it runs by hand): its size count and its command line.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.support.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "operator_client_cost.py"


def _load():
    spec = importlib.util.spec_from_file_location("operator_client_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sizes_count_the_packages_but_not_pip_nor_setuptools(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name, size in (("lightkube", 3 * 2**20), ("pip", 2**20), ("setuptools-80.dist-info", 2**20)):
        (site / name).mkdir(parents=True)
        (site / name / "blob").write_bytes(b"x" * size)
    (site / "six.py").write_bytes(b"x" * 2**20)
    assert _load().site_packages_mib(tmp_path / "venv") == 4.0
