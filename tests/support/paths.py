"""Where the checkout's parts are, for a test or helper wherever it sits under tests/."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
EXAMPLES = ROOT / "examples"
TOY = EXAMPLES / "data" / "toy"
"""The toy task ("3+4=" -> "7") every end-to-end job trains on."""
BENCHMARKS = ROOT / "benchmarks"
FIXTURES = SUPPORT / "fixtures"
