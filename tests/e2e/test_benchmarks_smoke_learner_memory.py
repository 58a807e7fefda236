"""Smoke run of benchmarks/learner_memory.py: two real 2-rank torchrun learners (ddp, fsdp) of the tiny-smoke
Llama; the report's per-rank state must be the model's bytes for ddp and exactly half for fsdp."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.benchmark_runs import TINY_SMOKE_PARAMS
from tests.support.paths import ROOT


def test_fsdp_ranks_hold_half_the_state_of_ddp_ranks(tmp_path):
    sizes = ["--prompts", "2", "--samples", "2", "--prompt-tokens", "8", "--new-tokens", "8", "--steps", "1"]
    done = subprocess.run(
        [sys.executable, "benchmarks/learner_memory.py", "--models", "tiny-smoke", "--learners", "2",
         *sizes, "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    by = {(r["sharding"], r["rank"]): r for r in rows}
    assert sorted(by) == [("ddp", 0), ("ddp", 1), ("fsdp", 0), ("fsdp", 1)]
    for rank in (0, 1):
        ddp, fsdp = by["ddp", rank], by["fsdp", rank]
        assert ddp["parameters"] == fsdp["parameters"] == TINY_SMOKE_PARAMS
        assert ddp["params_bytes"] == ddp["grads_bytes"] == 4 * TINY_SMOKE_PARAMS
        assert (
            2 * fsdp["params_bytes"] == ddp["params_bytes"] and 2 * fsdp["grads_bytes"] == ddp["grads_bytes"]
        )
        # AdamW: two moments per parameter element, plus a step counter per tensor that is not sharded.
        steps = ddp["optimizer_bytes"] - 2 * ddp["params_bytes"]
        assert 0 < steps < 1024 and fsdp["optimizer_bytes"] == 2 * fsdp["params_bytes"] + steps
        assert fsdp["peak_rss_over_imports_bytes"] > 0 and len(fsdp["update_s"]) == 1
    table = (tmp_path / "table.md").read_text()
    assert "| tiny-smoke | float32 | 0.1 M | fsdp | rank0 | 2 |" in table
    assert by["fsdp", 1]["load"] == "rank0" and by["ddp", 1]["load"] == "every"
