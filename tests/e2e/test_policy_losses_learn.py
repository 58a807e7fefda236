"""The tiny job learns with every registered policy loss, and with a vLLM-like rollout engine whose
log-probs differ from the learner's (mismatch corrected by TIS, reported in the metrics).

The runtime is `dverl run`'s (coordinator, trainer, colocated rollout and reward) driven in-process by the
Python facade, as tests/e2e/test_api_facade.py does; about two seconds a run on 2 cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from decentralized_verl import (
    Algorithm,
    AlgorithmConfig,
    DecentralizedConfig,
    DecentralizedTrainer,
    ModelConfig,
    TrainingConfig,
)
from decentralized_verl.backends.base import GenerationOutput, GenerationRequest
from decentralized_verl.backends.factory import ENGINES
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spec import TinyModelSpec, with_defaults
from decentralized_verl.spec.catalogue.algorithms import POLICY_LOSS_NAMES
from decentralized_verl.spec.catalogue.backends import VLLM
from decentralized_verl.spec.manifest import parse_spec

ENGINE_NOISE = 0.1
"""Std of the stand-in engine's per-token log-prob error (nats); a bf16 vLLM engine's is of this order."""


class Tiny:
    tiny = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    dtype = "float32"
    lora = None
    path = package = gguf_file = None


def reward(prompt: str, completion: str) -> float:  # prefer completions starting with "a"
    return 1.0 if completion.startswith("a") else 0.0


def config(policy_loss: str, seed: int = 0) -> DecentralizedConfig:
    return DecentralizedConfig(
        model=ModelConfig(model_name_or_path="tiny-in-memory"),
        training=TrainingConfig(
            algorithm=Algorithm.GRPO,
            actor_lr=3e-3,
            train_batch_size=4,
            samples_per_prompt=8,
            max_new_tokens=4,
            seed=seed,
        ),
        algorithm=AlgorithmConfig(policy_loss=policy_loss),
    )


def train(cfg: DecentralizedConfig, tmp_path) -> list[dict[str, Any]]:
    model, tokenizer = load_model_and_tokenizer(Tiny())
    trainer = DecentralizedTrainer(
        config=cfg, actor_model=model, tokenizer=tokenizer, reward_fn=reward, output_dir=tmp_path
    )
    return asyncio.run(trainer.train([f"say {i}" for i in range(8)], num_epochs=30))


def gain(history: list[dict[str, Any]]) -> float:
    first = sum(r["reward_mean"] for r in history[:5]) / 5
    last = sum(r["reward_mean"] for r in history[-5:]) / 5
    return last - first


@pytest.mark.parametrize("policy_loss", POLICY_LOSS_NAMES)
def test_the_tiny_job_learns_with_each_policy_loss(policy_loss: str, tmp_path) -> None:
    history = train(config(policy_loss), tmp_path)
    assert len(history) == 60
    # ppo_clip gains 0.76-0.90 here across seeds (test_api_facade); a loss that does not learn stays near 0.
    assert gain(history) > 0.5, (policy_loss, [round(r["reward_mean"], 2) for r in history])
    own = {"ppo_clip": "pg_dual_clip_frac", "gspo": "pg_seq_ratio_mean", "cispo": "pg_weight_mean"}
    assert all(own.get(policy_loss, "pg_approx_kl") in r for r in history)  # the named loss ran
    if policy_loss == "vanilla_pg":
        assert all("pg_seq_ratio_mean" not in r and "pg_weight_mean" not in r for r in history)


class NoisyEngine(HFBackend):
    """The HF engine, but its log-probs carry a per-token error, as a vLLM engine's (other kernels, other
    precision) do: what the learner receives as the behaviour policy's log-probs."""

    def __init__(
        self, *args: Any, tensor_parallel_size: int = 1, enforce_eager: bool = False, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)  # takes the options a vLLM engine is built with, and needs neither
        self.noise = torch.Generator().manual_seed(1234)

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[GenerationOutput]:
        for out in super().generate(requests):
            error = ENGINE_NOISE * torch.randn(len(out.logprobs), generator=self.noise)
            yield dataclasses.replace(out, logprobs=tuple((torch.tensor(out.logprobs) + error).tolist()))


class VllmBackendConfig(DecentralizedConfig):
    """The facade's job with `roles.rollout.backend: vllm` (so the vllm defaults apply)."""

    def job_spec(self, train_file: str, steps: int) -> Any:
        spec = with_defaults(super().job_spec(train_file, steps))
        spec["roles"]["rollout"]["backend"] = VLLM.name
        return parse_spec(spec)


def test_a_vllm_like_engine_gets_tis_by_default_shows_the_mismatch_and_learns(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(ENGINES, VLLM, f"{__name__}:NoisyEngine")
    base = config("ppo_clip")
    cfg = VllmBackendConfig(model=base.model, training=base.training, algorithm=base.algorithm)
    history = train(cfg, tmp_path)
    assert gain(history) > 0.5, [round(r["reward_mean"], 2) for r in history]
    mismatch = [r["rollout_corr_abs_log_ratio_mean"] for r in history]
    # E|N(0, s)| = s * sqrt(2 / pi): the learner sees the engine's error, and nothing else
    assert sum(mismatch) / len(mismatch) == pytest.approx(ENGINE_NOISE * (2 / torch.pi) ** 0.5, rel=0.15)
    # exp(N(0, 0.1)) stays far below the cap of 2: weights near 1, none truncated, none rejected
    assert all(
        r["rollout_corr_truncated_frac"] == 0.0 and r["rollout_corr_masked_frac"] == 0.0 for r in history
    )
    assert all(abs(r["rollout_corr_weight_mean"] - 1.0) < 0.05 for r in history)
    assert all(r["rollout_corr_abs_log_ratio_max"] > r["rollout_corr_abs_log_ratio_mean"] for r in history)
    # the PPO ratio is against the learner's own log-probs, so the engine error is not in it
    assert all(abs(r["pg_ratio_mean"] - 1.0) < 1e-4 for r in history)
