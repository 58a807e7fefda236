"""The policy update, algorithm-blind: losses come from the registries by name; DDP averages gradients.

Every learner replica runs the same `PolicyTrainer.update` on its shard; torch.distributed (gloo on CPU,
nccl on GPU) averages gradients inside DistributedDataParallel, so replicas stay bit-identical.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.entropy import masked_entropy
from decentralized_verl.algorithms.kl import kl_in_loss
from decentralized_verl.core.samples import TrainBatch, response_logits, token_logprobs
from decentralized_verl.spec import JobSpec
from decentralized_verl.training.advantage_step import AlgorithmSettings


def chunks(index: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [index[i : i + size] for i in range(0, len(index), max(1, size))]


class PolicyTrainer:
    """Owns the optimizer of one learner replica."""

    def __init__(self, model: nn.Module, spec: JobSpec, *, distributed: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.settings = AlgorithmSettings.from_spec(spec)
        self.distributed = distributed
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            self.module: nn.Module = DistributedDataParallel(model)
        else:
            self.module = model
        params = [p for p in model.parameters() if p.requires_grad]
        training = spec.training
        self.optimizer = torch.optim.AdamW(
            params, lr=training.learning_rate, weight_decay=training.weight_decay
        )
        warmup = training.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.generator = torch.Generator().manual_seed(training.seed + 17)
        self.updates = 0

    def sizes(self, n_samples: int) -> tuple[int, int]:
        """(minibatch, microbatch) in samples: the spec counts prompts, each has samplesPerPrompt samples."""
        training, n = self.spec.training, self.spec.algorithm.samples_per_prompt
        mini = (training.minibatch_size or training.batch_size) * n
        micro = (training.microbatch_size or training.minibatch_size or training.batch_size) * n
        return min(mini, n_samples), min(micro, n_samples)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """PPO-style epochs over mini-batches with gradient accumulation over micro-batches."""
        assert batch.advantages is not None, "attach_advantages must run before update"
        s = self.settings
        self.module.train()
        mini, micro = self.sizes(batch.size)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(s.ppo_epochs):
            order = torch.randperm(batch.size, generator=self.generator)
            for minibatch in chunks(order, mini):
                self.optimizer.zero_grad(set_to_none=True)
                parts = chunks(minibatch, micro)
                for k, part in enumerate(parts):
                    sync = not self.distributed or k == len(parts) - 1
                    ctx = contextlib.nullcontext() if sync else self.module.no_sync()  # type: ignore[operator]
                    with ctx:
                        loss, metrics = self._loss(batch.select(part))
                        (loss / len(parts)).backward()
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value
                    count += 1
                params = [p for p in self.model.parameters() if p.requires_grad]
                norm = torch.nn.utils.clip_grad_norm_(params, self.spec.training.max_grad_norm)
                if not math.isfinite(float(norm)):
                    # A non-finite gradient would poison every replica's weights; skip this update.
                    self.optimizer.zero_grad(set_to_none=True)
                    sums["skipped_updates"] = sums.get("skipped_updates", 0.0) + 1
                    continue
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) * len(parts)
                self.optimizer.step()
                self.scheduler.step()
                self.updates += 1
        out = {key: value / max(count, 1) for key, value in sums.items() if key != "skipped_updates"}
        out["skipped_updates"] = sums.get("skipped_updates", 0.0)
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _loss(self, mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        s = self.settings
        logits = response_logits(self.module, mb, s.temperature)
        logprobs = token_logprobs(logits, mb)
        policy_loss = registry.lookup(registry.POLICY_LOSSES, "policy loss", s.policy_loss)
        loss, metrics = policy_loss(
            logprobs,
            mb.old_logprobs,
            mb.advantages,
            mb.response_mask,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            dual_clip=s.dual_clip,
            aggregation=s.aggregation,
            skip_threshold=s.skip_threshold,
        )
        metrics = {f"pg_{k}" if not k.startswith("pg_") else k: v for k, v in metrics.items()}
        metrics["pg_loss"] = float(loss.detach())
        if s.kl_coef > 0 and s.kl_in == "loss" and mb.ref_logprobs is not None:
            term, kl_metrics = kl_in_loss(
                logprobs,
                mb.ref_logprobs,
                mb.response_mask,
                kl_coef=s.kl_coef,
                estimator=s.kl_estimator,
                aggregation=s.aggregation,
            )
            loss = loss + term
            metrics["kl_loss"] = kl_metrics["kl"]
        if s.entropy_coef > 0:
            _, entropy = masked_entropy(logits, mb.response_mask, s.aggregation)
            loss = loss - s.entropy_coef * entropy
            metrics["entropy"] = float(entropy.detach())
        return loss, metrics


def rollout_state_dict(model: nn.Module) -> dict[str, Any]:
    """The weights rollout workers need, detached: for a LoRA model only the trainable adapter tensors,
    under the same names the rollout side's own LoRA model uses (its state_dict keys)."""
    from decentralized_verl.models.lora import is_lora

    if is_lora(model):
        return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in model.state_dict().items()}
