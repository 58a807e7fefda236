"""When evalEvery divides the steps, the last step's evaluation is the final one: the policy is evaluated
once per version (step 0 included) and eval.jsonl holds each evaluation exactly once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.orchestration.assemble import build_loop
from decentralized_verl.orchestration.wiring import connect_roles
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.trainer import PolicyTrainer
from tests.support.paths import TOY


def tiny_job(steps: int, eval_every: int):
    return parse_spec(
        {
            "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {
                "train": str(TOY / "train.jsonl"),
                "eval": str(TOY / "eval.jsonl"),
                "rewardType": "decentralized_verl.rewards.toy:first_number",
                "maxPromptTokens": 32,
                "maxNewTokens": 3,
            },
            "roles": {"rollout": {"replicas": 0, "batchSize": 4}, "learner": {"replicas": 1}},
            "training": {"steps": steps, "batchSize": 4, "learningRate": 1e-3, "evalEvery": eval_every},
        }
    )


async def train(spec, output: Path) -> tuple[dict, int]:
    """Run the job in this process; returns its summary and how many eval batches were generated."""
    model, tokenizer = load_model_and_tokenizer(spec.model)
    trainer = PolicyTrainer(model, spec)
    roles = await connect_roles(
        spec, "evals", model, tokenizer, temperature=1.0, publisher=None,
        addresses=lambda role: [], pools=lambda role: [],
    )  # fmt: skip
    loop = await build_loop(spec, trainer, tokenizer, roles, job="evals", output=output)
    dispatcher, runs = loop.coordinator.p.dispatcher, []
    generate = dispatcher.run

    async def counted(items, sampling, version):
        if sampling.temperature == 0.0:  # evaluations are the greedy batches
            runs.append(version)
        return await generate(items, sampling, version)

    dispatcher.run = counted
    try:
        summary = await loop.run()
    finally:
        await loop.close()
    return summary, len(runs)


def test_the_final_evaluation_reuses_the_last_steps(tmp_path: Path) -> None:
    summary, generated = asyncio.run(train(tiny_job(steps=4, eval_every=2), tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert generated == 3  # versions 0, 2 and 4, each once
    assert summary["eval_accuracy_after"] == rows[-1]["eval_accuracy"]
    assert summary["eval_accuracy_before"] == rows[0]["eval_accuracy"]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "eval_accuracy" in r] == [2, 4]


def test_a_final_evaluation_off_the_schedule_still_runs(tmp_path: Path) -> None:
    summary, generated = asyncio.run(train(tiny_job(steps=3, eval_every=2), tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 3] and generated == 3
    assert summary["eval_accuracy_after"] == rows[-1]["eval_accuracy"]
