"""Smoke run of benchmarks/qlora.py (LoRA vs QLoRA) on the tiny model: every variant reports, the 4-bit
variants hold fewer weight bytes than LoRA's, a version carries the adapters only, and a rollout worker
given those adapters computes exactly the learner's log-probs; the rollout-correction metrics of an
exact-base engine's samples against the 4-bit learner are reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import BENCHMARKS, ROOT


def test_qlora_benchmark_smoke(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "qlora.py"),
            "--model",
            "tiny",
            "--steps",
            "1",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    by_variant = {r["variant"]: r for r in rows if "variant" in r}
    assert set(by_variant) == {"lora", "qlora-nf4", "qlora-fp4"}
    for variant in ("qlora-nf4", "qlora-fp4"):
        assert by_variant[variant]["weights_bytes"] < by_variant["lora"]["weights_bytes"]
        assert by_variant[variant]["base_gap_max"] > 0  # 4 bits round the base
        row = by_variant[variant]  # an exact-base engine's samples against the 4-bit learner
        assert row["sampled_tokens"] > 0 and row["sampled_abs_log_ratio_max"] > 0 and row["sampled_kl"] >= 0
        assert 0 <= row["sampled_masked_frac"] <= 1
    for row in by_variant.values():
        assert row["version_bytes"] < row["full_weights_bytes"]
        assert row["version_bytes"] >= row["adapter_bytes"]
        assert row["mismatch_max"] == 0.0
    seven_b = next(r for r in rows if "variant" not in r)
    assert seven_b["version_bytes"] * 50 < seven_b["full_weights_bytes"]
    assert "| tiny | qlora-nf4 |" in (tmp_path / "table.md").read_text()
