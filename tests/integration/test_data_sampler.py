"""PromptSampler: determinism, exact resume from (epoch, offset), and data-parallel sharding,
checked against a slow reference that lays out the whole sequence of batches up front.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys

from decentralized_verl.data import epoch_order


def test_order_does_not_depend_on_the_hash_seed() -> None:
    code = "from decentralized_verl.data import epoch_order; print(epoch_order(30, 7, 2))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"{epoch_order(30, 7, 2)}\n"}
