"""KL to the reference is measured whenever the job has a reference role, klCoef 0 included (it is then
logged and plotted but adds nothing to the rewards or the loss); a job without one is told at validate
time that it will not see it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import parse_job, parse_spec, summary
from tests.support.in_process import run_in_process
from tests.support.paths import TOY


def _spec(**roles: dict) -> dict:
    return {
        "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2, "klCoef": 0.0},
        "data": {
            "train": str(TOY / "train.jsonl"),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
            "maxPromptTokens": 32,
            "maxNewTokens": 3,
        },
        "roles": {"rollout": {"replicas": 0, "batchSize": 4}, "learner": {"replicas": 1}, **roles},
        "training": {"steps": 3, "batchSize": 4, "learningRate": 1e-2},
    }


async def _train(output: Path) -> list[dict]:
    spec = parse_spec(_spec(reference={"replicas": 0}))
    model, tokenizer = load_model_and_tokenizer(spec.model)
    await run_in_process(spec, model, tokenizer, output, job="kl")
    return read_metrics(output / "metrics.jsonl")


def test_kl_is_measured_at_kl_coef_zero_with_a_reference(tmp_path: Path) -> None:
    records = asyncio.run(_train(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all("kl" in r for r in records)
    assert records[0]["kl"] < 1e-6  # the first batch is sampled by the reference's own weights
    assert records[-1]["kl"] > 1e-4  # two updates later the policy has moved away from it
    assert not any("kl_loss" in r for r in records)  # measured only: no KL term in the loss


def test_validate_says_when_kl_is_not_measured() -> None:
    without = parse_job({"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "a"},
                         "spec": _spec()})  # fmt: skip
    with_ref = parse_job({"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "b"},
                          "spec": _spec(reference={"replicas": 0})})  # fmt: skip
    assert "KL to the initial policy not measured (no roles.reference)" in summary(without)
    assert "KL coef 0" in summary(with_ref) and "not measured" not in summary(with_ref)
