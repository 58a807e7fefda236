"""The checked-in CRD is exactly `dverl crd`'s output, and it is a structural Kubernetes schema.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys

from decentralized_verl.spec.crd import crd_yaml
from tests.support.paths import ROOT


def test_checked_in_crd_matches_generator() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", "crd"], capture_output=True, text=True, check=True
    ).stdout
    assert out == crd_yaml()
    assert (ROOT / "crds" / "rlhfjob.yaml").read_text() == out, "crds/rlhfjob.yaml drifted: run `dverl crd`"
