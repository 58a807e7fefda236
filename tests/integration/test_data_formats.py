"""Every data layout's happy path, in every file format, through the public loaders.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys


def test_package_import_pulls_in_no_heavy_modules() -> None:
    code = (
        "import sys, decentralized_verl.data\n"
        "print(sorted(m for m in ('torch', 'transformers', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
