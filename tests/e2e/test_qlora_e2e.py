"""A QLoRA GRPO job end to end, as `dverl run` runs it: a tiny Llama whose base is held in 4 bits (NF4,
bitsandbytes on this CPU) with LoRA adapters training on top, a rollout worker process of its own that
receives only the adapters each version (signed, over the weights service), and the reference inside the
learner as the same base with the adapters off. Checkpoints keep the adapters; a resume continues from
them; `dverl export` merges them into the full-precision base.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.training.run_export import export_run
from tests.support.job_manifests import e2e_manifest

QLORA = {
    "model.lora": {"rank": 8, "alpha": 16, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "model.quantization": {"type": "nf4", "doubleQuant": True},
    "algorithm.klCoef": 0.001,
    "algorithm.rolloutCorrection": {"enabled": True},
    "roles.reference": {"replicas": 0},
    "roles.rollout": {"replicas": 1, "batchSize": 16},
    "training.learningRate": 2.0e-2,
    "training.evalEvery": 0,
    "training.checkpoint": {"every": 3, "dir": "ckpt"},
}


def test_qlora_job_ships_adapters_keeps_one_base_and_resumes_from_adapters(tmp_path: Path) -> None:
    first = e2e_manifest(tmp_path, "qlora-e2e", **{**QLORA, "training.steps": 3})
    run_job(first, tmp_path / "run", progress=False, timeout=900)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    # the reference is the adapter-free base: no drift at step 1 (adapters start at B = 0), then drift
    assert abs(records[0]["kl"]) < 1e-9 and records[-1]["kl"] > 1e-6
    # the rollout process computes what the learner does, to float rounding (its decode steps against
    # the learner's whole-sequence forward), after every adapters-only refresh: the adapters arrived
    gaps = [r["rollout_corr_abs_log_ratio_max"] for r in records]
    assert all(gap < 1e-4 for gap in gaps), gaps
    assert max(r["policy_version"] for r in records) == 3
    folder = tmp_path / "run" / "ckpt" / "checkpoint-3"
    base = json.loads((folder / "base.json").read_text())
    assert base["quantization"]["type"] == "nf4" and len(base["digest"]) == 64
    assert not list(folder.glob("*.safetensors"))  # the 4-bit base is named, not saved

    second = e2e_manifest(tmp_path, "qlora-e2e", **{**QLORA, "training.steps": 5})
    summary = run_job(second, tmp_path / "run", resume=True, progress=False, timeout=900)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert summary["steps"] == 5 and summary["policy_version"] == 5
    assert records[3]["kl"] > 1e-6  # resumed adapters, not fresh ones: the policy has already moved
    assert all(r["rollout_corr_abs_log_ratio_max"] < 1e-4 for r in records[3:])

    out = export_run(tmp_path / "run", None, tmp_path / "export")
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert merged.dtype == next(iter(merged.parameters())).dtype
    assert not any("Linear4bit" in type(m).__name__ for m in merged.modules())
