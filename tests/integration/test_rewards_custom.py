"""User callables (`module:function`), the registry, batch dispatch and the torch-free import.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys


def test_package_import_stays_light() -> None:
    code = (
        "import sys, decentralized_verl.rewards as r\n"
        "heavy = [m for m in ('torch', 'transformers', 'sympy', 'math_verify') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert 'code' in r.REWARD_TYPES\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
