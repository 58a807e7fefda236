"""Seed 000's Python API drives the same runtime (coordinator, trainer, role clients) in-process.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys


def test_package_import_stays_light() -> None:
    code = "import sys, decentralized_verl; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"
