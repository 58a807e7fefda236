"""The Python API as a thin facade over the runtime: it builds a JobSpec and runs the same
Coordinator, trainer and role clients that `dverl run` uses, with every role colocated in this process.

    config = DecentralizedConfig(model=ModelConfig(model_name_or_path="/models/x", dtype="bfloat16"))
    trainer = DecentralizedTrainer(config=config, actor_model=model, tokenizer=tokenizer, reward_fn=fn)
    await trainer.train(prompts, num_epochs=3)
"""

from __future__ import annotations

import enum
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl.orchestration.assemble import build_loop
from decentralized_verl.orchestration.wiring import connect_roles
from decentralized_verl.spec.catalogue.algorithms import PRESETS
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.trainer import PolicyTrainer

Algorithm = enum.StrEnum("Algorithm", {name.upper(): name for name in PRESETS})
"""Every preset name of `spec.algorithm.name` (Algorithm.GRPO == "grpo"), read from the preset registry."""


@dataclass
class NetworkConfig:
    """Where a job's DHT is. This facade trains in this process only: peers given here are refused with
    a pointer to the DHT quick start (`dverl-train --initial-peers ...`), never silently ignored."""

    initial_peers: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    model_name_or_path: str = ""
    dtype: str = "float32"
    use_lora: bool = False
    lora_rank: int = 16


@dataclass
class TrainingConfig:
    algorithm: Algorithm = Algorithm.GRPO
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    train_batch_size: int = 8
    rollout_batch_size: int | None = None
    """Prompts per rollout request (`roles.rollout.batchSize`); None: the training batch."""
    max_grad_norm: float = 1.0
    samples_per_prompt: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    seed: int = 0


@dataclass
class AlgorithmConfig:
    reward_type: str = "boxed"
    reward_model_name: str | None = None
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0
    clip_range: float | None = None
    """The lower clip range; None: the policy loss's default (0.2 for ppo_clip)."""
    policy_loss: str = "ppo_clip"
    """ppo_clip, gspo, cispo or vanilla_pg (`algorithm.policyLoss`)."""


@dataclass
class DecentralizedConfig:
    network: NetworkConfig = field(default_factory=NetworkConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)

    def job_spec(self, train_file: str, steps: int) -> Any:
        """The RLHFJob spec this configuration means (validated like any manifest)."""
        t, a = self.training, self.algorithm
        if self.network.initial_peers:
            raise ValueError(
                "network.initial_peers: DecentralizedTrainer trains in this process; to train with workers "
                "found through a DHT run `dverl-train --initial-peers MADDR --prompts-file FILE`"
            )
        algorithm = Algorithm(t.algorithm).value
        spec: dict[str, Any] = {
            "model": {"path": self.model.model_name_or_path or "in-memory", "dtype": self.model.dtype},
            "algorithm": {
                "name": algorithm,
                "samplesPerPrompt": t.samples_per_prompt,
                "policyLoss": a.policy_loss,
                "klCoef": a.kl_coef,
                "gamma": a.gamma,
                "lam": a.lam,
            },
            "data": {
                "train": train_file,
                "rewardType": a.reward_type,
                "maxNewTokens": t.max_new_tokens,
                "temperature": t.temperature,
            },
            "roles": {
                "rollout": {"replicas": 0, "batchSize": t.rollout_batch_size or t.train_batch_size},
                "learner": {"replicas": 1},
            },
            "training": {
                "steps": steps,
                "batchSize": t.train_batch_size,
                "learningRate": t.actor_lr,
                "criticLearningRate": t.critic_lr,
                "maxGradNorm": t.max_grad_norm,
                "seed": t.seed,
            },
        }
        if a.clip_range is not None:
            spec["algorithm"]["clipLow"] = a.clip_range
        if self.model.use_lora:
            spec["model"]["lora"] = {"rank": self.model.lora_rank, "alpha": 2.0 * self.model.lora_rank}
        if algorithm == "ppo":
            spec["roles"]["critic"] = {"replicas": 0}
        if a.kl_coef > 0:
            spec["roles"]["reference"] = {"replicas": 0}
        if a.reward_model_name:
            spec["data"]["rewardType"] = "reward_model"
            spec["data"]["rewardModel"] = {"path": a.reward_model_name}
        return parse_spec(spec)


class _CallableReward:
    """Adapts `reward_fn(prompt, completion) -> float` to the RewardClient protocol."""

    def __init__(self, fn: Callable[[str, str], float]) -> None:
        self.fn = fn

    async def score(self, samples, reward_type: str) -> list[tuple[float, str]]:
        out = []
        for sample in samples:
            try:
                out.append((float(self.fn(sample.prompt.text, sample.text)), "reward_fn"))
            except Exception as exc:  # a user's function failing must not stop training
                out.append((0.0, f"reward_fn raised {exc!r}"))
        return out


class DecentralizedTrainer:
    """Train `actor_model` in this process with the runtime's coordinator; returns per-step metrics."""

    def __init__(
        self,
        config: DecentralizedConfig,
        actor_model: Any,
        tokenizer: Any,
        reward_fn: Callable[[str, str], float] | None = None,
        output_dir: str | Path | None = None,
    ) -> None:
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.config = config
        self.model = actor_model
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.output_dir = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="dverl-api-"))
        self.history: list[dict[str, Any]] = []

    async def train(
        self, prompts: Sequence[str] | Sequence[dict[str, str]], num_epochs: int = 1
    ) -> list[dict[str, Any]]:
        """`prompts`: strings, or dicts with `prompt` and optional `answer` for verifiable rewards."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        train_file = self.output_dir / "prompts.jsonl"
        with train_file.open("w") as handle:
            for item in prompts:
                record = {"prompt": item} if isinstance(item, str) else dict(item)
                handle.write(json.dumps(record) + "\n")
        batch = self.config.training.train_batch_size
        steps = max(1, len(prompts) // batch) * num_epochs
        spec = self.config.job_spec(str(train_file), steps)
        trainer = PolicyTrainer(self.model, spec)
        roles = await connect_roles(
            spec,
            "api",
            self.model,
            self.tokenizer,
            temperature=trainer.settings.temperature,
            publisher=None,
            addresses=lambda role: [],
            pools=lambda role: [],
            reward_override=_CallableReward(self.reward_fn) if self.reward_fn else None,
        )
        loop = await build_loop(
            spec,
            trainer,
            self.tokenizer,
            roles,
            job="api",
            output=self.output_dir,
            on_step=self.history.append,
        )
        try:
            await loop.run()
        finally:
            await loop.close()
        return self.history
