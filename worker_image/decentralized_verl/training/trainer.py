"""The policy update, algorithm-blind: losses come from the registries by name; DDP averages gradients.

Every learner replica runs the same `PolicyTrainer.update` on its shard; torch.distributed (gloo on CPU,
nccl on GPU) averages gradients inside DistributedDataParallel, so replicas stay bit-identical.

With a rollout correction in force the update first recomputes the batch's log-probs with the learner's
current weights: the loss's ratio is then taken against those, and the rollout's own log-probs only set
the correction's importance weights and rejections (`algorithms.rollout_correction`). Without one, the
loss's ratio is against the rollout's log-probs directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any

import torch
from torch import nn

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.kl import kl_in_loss
from decentralized_verl.algorithms.policy_loss import aggregate
from decentralized_verl.algorithms.rollout_correction import correct_rollout
from decentralized_verl.core.forward import ForwardChooser, response_logprobs
from decentralized_verl.core.samples import TrainBatch
from decentralized_verl.spec import JobSpec
from decentralized_verl.training import microbatches
from decentralized_verl.training.advantage_step import AlgorithmSettings


class PolicyForward(nn.Module):
    """The policy's log-probs (and entropy) of a micro-batch as one module call, so DistributedDataParallel
    sees the shared-prompt forward's two passes as one forward."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.plain = False
        """The model's own call over the padded batch instead of the shared-prompt forward."""

    def forward(self, batch: TrainBatch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return response_logprobs(self.model, batch, self.temperature, entropy=entropy, plain=self.plain)


class PolicyTrainer:
    """Owns the optimizer of one learner replica."""

    def __init__(self, model: nn.Module, spec: JobSpec, *, distributed: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.settings = AlgorithmSettings.from_spec(spec)
        self.distributed = distributed
        forward = PolicyForward(model, self.settings.temperature)
        self.forward = forward
        device = next(model.parameters()).device
        self.chooser = ForwardChooser(device.type)
        self.force_plain = False
        """Always the model's own call over the padded batch (benchmarks compare the two forwards)."""
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            self.module: nn.Module = DistributedDataParallel(forward)
        else:
            self.module = forward
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

    def microbatch_plan(self, batch: TrainBatch) -> list[list[torch.Tensor]]:
        """Row indices per micro-batch, per mini-batch, for one epoch (whole prompt groups together)."""
        training = self.spec.training
        mini = training.minibatch_size or training.batch_size
        micro = training.microbatch_size or mini
        prompt_lengths = batch.attention_mask[:, : batch.prompt_length].sum(dim=1)
        groups = microbatches.groups_of(batch.group_index, prompt_lengths, batch.response_lengths)
        plan = []
        for minibatch in microbatches.minibatches(groups, mini, self.generator):
            if training.microbatch_tokens:
                parts = microbatches.by_tokens(minibatch, training.microbatch_tokens)
            else:
                parts = microbatches.by_rows(minibatch, micro)
            plan.append([torch.tensor(microbatches.rows_of(part), dtype=torch.long) for part in parts])
        return plan

    def learner_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, R] log-probs of the batch's responses under the current weights, no gradient, computed in the
        update's micro-batches (whole prompt groups, same row or token budget) in a fixed order."""
        training = self.spec.training
        micro = training.microbatch_size or training.minibatch_size or training.batch_size
        prompt_lengths = batch.attention_mask[:, : batch.prompt_length].sum(dim=1)
        groups = microbatches.groups_of(batch.group_index, prompt_lengths, batch.response_lengths)
        if training.microbatch_tokens:
            parts = microbatches.by_tokens(groups, training.microbatch_tokens)
        else:
            parts = microbatches.by_rows(groups, micro)
        out = torch.zeros_like(batch.old_logprobs)
        self.forward.plain = self.force_plain
        with torch.no_grad():
            for part in parts:
                rows = torch.tensor(microbatches.rows_of(part), dtype=torch.long)
                logprobs, _ = self.forward(batch.select(rows))
                out[rows] = logprobs.to(out.dtype)
        return out

    def corrected(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """The batch the loss sees: as given without a rollout correction; with one, the learner's log-probs
        as `old_logprobs`, rejected tokens out of `loss_mask` and the importance weights attached."""
        config = self.settings.rollout_correction
        if config is None:
            return batch, {}
        learner = self.learner_logprobs(batch)
        weights, kept, metrics = correct_rollout(learner, batch.old_logprobs, batch.trained_mask(), config)
        fixed = dataclasses.replace(
            batch,
            old_logprobs=learner,
            loss_mask=kept.to(batch.response_mask.dtype),
            rollout_weights=weights.to(learner.dtype),
        )
        return fixed, {f"rollout_corr_{key}": value for key, value in metrics.items()}

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """PPO-style epochs over mini-batches with gradient accumulation over micro-batches."""
        assert batch.advantages is not None, "attach_advantages must run before update"
        s = self.settings
        batch, correction_metrics = self.corrected(batch)
        self.module.train()
        sums: dict[str, float] = {}
        count = 0
        for _ in range(s.ppo_epochs):
            for parts in self.microbatch_plan(batch):
                self.optimizer.zero_grad(set_to_none=True)
                weights = microbatches.loss_weights(batch.trained_mask(), parts, s.aggregation)
                for k, (part, weight) in enumerate(zip(parts, weights, strict=True)):
                    sync = not self.distributed or k == len(parts) - 1
                    ctx = contextlib.nullcontext() if sync else self.module.no_sync()  # type: ignore[operator]
                    micro = batch.select(part)
                    plain = self.force_plain or self.chooser.plain_next()
                    self.forward.plain = plain
                    began = time.perf_counter()
                    with ctx:
                        loss, metrics = self._loss(micro)
                        (loss * weight).backward()
                    self.chooser.record(plain, _synced(began), int(micro.input_ids.numel()))
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
        out.update(correction_metrics)
        return out

    def _loss(self, mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        s = self.settings
        logprobs, entropy = self.module(mb, entropy=s.entropy_coef > 0)
        mask = mb.trained_mask()
        policy_loss = registry.lookup(registry.POLICY_LOSSES, "policy loss", s.policy_loss)
        loss, metrics = policy_loss(
            logprobs,
            mb.old_logprobs,
            mb.advantages,
            mask,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            dual_clip=s.dual_clip,
            aggregation=s.aggregation,
            skip_threshold=s.skip_threshold,
            weights=mb.rollout_weights,
        )
        metrics = {f"pg_{k}" if not k.startswith("pg_") else k: v for k, v in metrics.items()}
        metrics["pg_loss"] = float(loss.detach())
        if s.kl_coef > 0 and s.kl_in == "loss" and mb.ref_logprobs is not None:
            term, kl_metrics = kl_in_loss(
                logprobs,
                mb.ref_logprobs,
                mask,
                kl_coef=s.kl_coef,
                estimator=s.kl_estimator,
                aggregation=s.aggregation,
            )
            loss = loss + term
            metrics["kl_loss"] = kl_metrics["kl"]
        if s.entropy_coef > 0:
            bonus = aggregate(entropy, mask, s.aggregation)
            loss = loss - s.entropy_coef * bonus
            metrics["entropy"] = float(bonus.detach())
        return loss, metrics


def _synced(began: float) -> float:
    """Seconds since `began`, after the GPU (if any) finished what was queued."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - began


def rollout_state_dict(model: nn.Module) -> dict[str, Any]:
    """The weights rollout workers need, detached: for a LoRA model only the trainable adapter tensors,
    under the same names the rollout side's own LoRA model uses (its state_dict keys)."""
    from decentralized_verl.models.lora import is_lora

    if is_lora(model):
        return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in model.state_dict().items()}
