"""A QLoRA GRPO job learns: a tiny Llama whose decoder linears are held in 4 bits (NF4, bitsandbytes on
this CPU) with LoRA adapters on top raises its reward on the toy task within 40 steps, and its 4-bit base
stays the codes it was quantized to. Every role runs in this process (`replicas: 0`), the loop `dverl
run`'s learner runs; a few seconds on 2 cores.

The adapters include `lm_head` because a randomly initialised model's head caps what adapters below it can
do: its rows are small (std 0.02, as Hugging Face initialises them) and the final RMSNorm fixes the hidden
state's norm, so no hidden state at all gives the ten digits more than about 14% of the probability mass
(10% when uniform). Adapters on the attention and MLP alone leave the reward flat, with LoRA and QLoRA
alike; an adapter on the head (full precision: quantization leaves the head alone) moves the logits
directly. docs/qlora.md says more; a pretrained head does not cap its policy like this.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import torch

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.models.quantization import is_quantized
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import parse_spec
from tests.support.in_process import run_in_process
from tests.support.paths import TOY

STEPS = 40
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
SPEC = {
    "model": {
        "tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128},
        "lora": {"rank": 8, "alpha": 16, "targetModules": [*ATTENTION, "lm_head"]},
        "quantization": {"type": "nf4", "doubleQuant": True},
    },
    "algorithm": {"name": "grpo", "samplesPerPrompt": 8, "klCoef": 0.0},
    "data": {
        "train": str(TOY / "train.jsonl"),
        "rewardType": "decentralized_verl.rewards.toy:first_number",
        "maxPromptTokens": 64,
        "maxNewTokens": 8,
        "temperature": 1.0,
    },
    "roles": {"rollout": {"replicas": 0, "batchSize": 16}, "learner": {"replicas": 1}},
    "training": {"steps": STEPS, "batchSize": 16, "learningRate": 5e-3, "evalEvery": 0, "seed": 0},
}


def packed_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every 4-bit layer's packed codes, copied."""
    return {
        name: module.weight.data.clone()
        for name, module in model.named_modules()
        if type(module).__name__ == "Linear4bit"
    }


def test_a_qlora_grpo_job_raises_its_reward_on_the_toy_task(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    model, tokenizer = load_model_and_tokenizer(spec.model)
    assert is_quantized(model)
    base = packed_weights(model)
    assert len(base) == 2 * 7  # every decoder linear of both layers is 4-bit

    asyncio.run(run_in_process(spec, model, tokenizer, tmp_path, job="qlora-learns"))

    records = read_metrics(tmp_path / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in records]
    assert len(rewards) == STEPS
    # refit parity: the rollout's log-probs are the learner's own on every step (the same 4-bit layers)
    assert max(r["refit_logprob_diff_max"] for r in records) < 1e-4
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-10:])
    # about 0.04 at first (the first character is rarely a digit) and 0.4-0.5 by the end on every seed
    # tried; the margin leaves room for any seed's sampling
    assert last > first + 0.2, rewards
    # only the adapters learned: the base holds the codes it was quantized to
    after = packed_weights(model)
    assert after.keys() == base.keys() and all(torch.equal(after[k], base[k]) for k in base)
