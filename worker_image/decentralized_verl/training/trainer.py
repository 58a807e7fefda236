"""The policy update, algorithm-blind: losses come from the registries by name; DDP or FSDP2 averages
gradients.

Every learner replica runs the same `PolicyTrainer.update` on its shard; torch.distributed (gloo on CPU,
nccl on GPU) averages gradients. With `roles.learner.sharding: ddp` (the default) each replica holds the
whole model inside DistributedDataParallel, so replicas stay bit-identical. With `fsdp` the trainer shards
the model in place over the replicas (`training.sharding`): each holds a slice of the parameters,
gradients and optimizer state, every forward and backward is collective, and reading the weights
(`LearnerGroup.weights`) gathers them on every rank.

With a rollout correction in force the update first recomputes the batch's log-probs with the learner's
current weights: the loss's ratio is then taken against those, and the rollout's own log-probs only set
the correction's importance weights and rejections (`algorithms.rollout_correction`). Without one, the
loss's ratio is against the rollout's log-probs directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.kl import kl_in_loss
from decentralized_verl.algorithms.policy_loss import aggregate
from decentralized_verl.algorithms.rollout_correction import correct_rollout
from decentralized_verl.core.forward import ForwardChooser, response_logprobs
from decentralized_verl.core.samples import TrainBatch
from decentralized_verl.models.lora import is_lora
from decentralized_verl.runtime.device import synchronize
from decentralized_verl.spec import JobSpec
from decentralized_verl.training import microbatches
from decentralized_verl.training.advantage_step import AlgorithmSettings
from decentralized_verl.training.optimizer_step import optimizer_step
from decentralized_verl.training.rank_group import collective_device
from decentralized_verl.training.refit_parity import ParityMeter
from decentralized_verl.training.sharding import is_sharded, shard_model


class PolicyForward(nn.Module):
    """The policy's log-probs (and entropy) of a micro-batch as one module call, so DistributedDataParallel
    and FSDP see the shared-prompt forward's two passes as one forward."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.plain = False
        """The model's own call over the padded batch instead of the shared-prompt forward."""
        self.whole_outputs = False
        """Return tensors that are not views (FSDP's backward hook on an output is lost to an in-place
        write into a view, and FSDP warns about every view it is given)."""

    def forward(self, batch: TrainBatch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        logprobs, ent = response_logprobs(
            self.model, batch, self.temperature, entropy=entropy, plain=self.plain
        )
        if self.whole_outputs:
            logprobs = logprobs.clone() if logprobs._is_view() else logprobs
            ent = ent.clone() if ent is not None and ent._is_view() else ent
        return logprobs, ent


class PolicyTrainer:
    """Owns the optimizer of one learner replica.

    `spec.roles.learner` decides how the model is held. With sharding fsdp the trainer shards `model` in
    place when it is built (pass it unsharded; every rank of the group must build its trainer, after
    `init_distributed`): its parameters become DTensor shards, so `model` itself must then be read
    through `LearnerGroup.weights` / `sharding.full_state_dict` (collective). Activation checkpointing applies
    to ddp and fsdp alike."""

    def __init__(self, model: nn.Module, spec: JobSpec, *, distributed: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.settings = AlgorithmSettings.from_spec(spec)
        role = spec.roles.learner
        self.sharded = role.sharding == "fsdp"
        self.distributed = distributed
        forward = PolicyForward(model, self.settings.temperature)
        if self.sharded or role.activation_checkpointing:
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            # The root is PolicyForward, the module the step calls: see `training.sharding`.
            shard_model(
                forward,
                sharding=role.sharding,
                world=world,
                dtype=next(model.parameters()).dtype,
                cpu_offload=role.cpu_offload,
                activation_checkpointing=role.activation_checkpointing,
            )
        self.forward = forward
        device = next(model.parameters()).device  # after sharding: a meta-built model has storage now
        self.device = device
        """Where the model computes; batches (collated on the CPU) move here at the start of an update."""
        self.chooser = ForwardChooser(device.type)
        self.force_plain = False
        """Always the model's own call over the padded batch (benchmarks compare the two forwards)."""
        if self.sharded:
            forward.whole_outputs = True
            self.module: nn.Module = forward
        elif distributed:
            self.module = DistributedDataParallel(forward)
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
        self.parity_rows: list[float] = []
        """Each row's max |rollout - learner| log-prob of the last update (NaN: not compared), this rank's."""

    def microbatch_plan(self, batch: TrainBatch) -> list[list[torch.Tensor]]:
        """Row indices per micro-batch, per mini-batch, for one epoch (whole prompt groups together)."""
        training = self.spec.training
        mini = training.minibatch_size or training.batch_size
        micro = training.microbatch_size or mini
        minibatches = microbatches.minibatches(self._groups(batch), mini, self.generator)
        return [self._cut(minibatch, micro) for minibatch in minibatches]

    @staticmethod
    def _groups(batch: TrainBatch) -> list[microbatches.Group]:
        """The batch's prompt groups with their token counts, the unit that micro-batches never split."""
        prompt_lengths = batch.attention_mask[:, : batch.prompt_length].sum(dim=1)
        return microbatches.groups_of(batch.group_index, prompt_lengths, batch.response_lengths)

    def _cut(self, groups: list[microbatches.Group], micro: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch that `groups` are cut into: by the token budget when
        `training.microbatchTokens` is set, else by `micro` rows. The update and the learner's log-prob
        pass cut alike, so both run the same micro-batch shapes."""
        tokens = self.spec.training.microbatch_tokens
        parts = microbatches.by_tokens(groups, tokens) if tokens else microbatches.by_rows(groups, micro)
        return [torch.tensor(microbatches.rows_of(part), dtype=torch.long) for part in parts]

    def learner_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, R] log-probs of the batch's responses under the current weights, no gradient, computed in the
        update's micro-batches (whole prompt groups, same row or token budget) in a fixed order."""
        training = self.spec.training
        micro = training.microbatch_size or training.minibatch_size or training.batch_size
        rows_per_part = self._cut(self._groups(batch), micro)
        out = torch.zeros_like(batch.old_logprobs)
        self.forward.plain = self.force_plain
        with torch.no_grad():
            for rows, real in self._lockstep([rows_per_part])[0]:
                logprobs, _ = self.forward(batch.select(rows))
                if real:
                    out[rows] = logprobs.to(out.dtype)
        return out

    def corrected(
        self, batch: TrainBatch, parity: ParityMeter | None = None
    ) -> tuple[TrainBatch, dict[str, float]]:
        """The batch the loss sees: as given without a rollout correction; with one, the learner's log-probs
        as `old_logprobs`, rejected tokens out of `loss_mask` and the importance weights attached (and
        compared with the rollout's on `parity`)."""
        config = self.settings.rollout_correction
        if config is None:
            return batch, {}
        learner = self.learner_logprobs(batch)
        if parity is not None:
            parity.add(torch.arange(batch.size), learner, batch.old_logprobs, batch.trained_mask())
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
        batch = batch.to(self.device)
        s = self.settings
        parity = ParityMeter(batch.size, batch.parity_rows, self.device)
        batch, correction_metrics = self.corrected(batch, parity)
        # Without a correction pass the learner's log-probs of the refreshed weights are those of the first
        # mini-batch's forward, before its optimizer step: the parity is read there, for free.
        measuring = s.rollout_correction is None
        self.module.train()
        sums: dict[str, float] = {}
        count = 0
        for _ in range(s.ppo_epochs):
            for steps in self._lockstep(self.microbatch_plan(batch)):
                self.optimizer.zero_grad(set_to_none=True)
                parts = [part for part, real in steps if real]
                weights = iter(microbatches.loss_weights(batch.trained_mask(), parts, s.aggregation))
                for k, (part, real) in enumerate(steps):
                    # A stand-in micro-batch (see `_lockstep`) runs with weight 0: no gradient of its own.
                    weight = next(weights) if real else 0.0
                    micro = batch.select(part)
                    plain = self.force_plain or self.chooser.plain_next()
                    self.forward.plain = plain
                    began = time.perf_counter()
                    with self._accumulating(last=k == len(steps) - 1):
                        loss, metrics, logprobs = self._loss(micro)
                        (loss * weight).backward()
                    if measuring and real:
                        parity.add(part, logprobs, micro.old_logprobs, micro.trained_mask())
                    self._record(plain, _synced(began), int(micro.input_ids.numel()))
                    if not real:
                        continue
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value
                    count += 1
                # The norm is global (all-reduced by DDP's gradients or FSDP's DTensor norm), so every
                # replica skips a non-finite gradient alike.
                measuring = False  # the weights change from here on
                step = optimizer_step(
                    self.optimizer,
                    [p for p in self.model.parameters() if p.requires_grad],
                    max_grad_norm=self.spec.training.max_grad_norm,
                    scheduler=self.scheduler,
                    skip_nonfinite=True,
                )
                if step.skipped:
                    sums["skipped_updates"] = sums.get("skipped_updates", 0.0) + 1
                    continue
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + (step.grad_norm or 0.0) * len(parts)
                self.updates += 1
        out = {key: value / max(count, 1) for key, value in sums.items() if key != "skipped_updates"}
        out["skipped_updates"] = sums.get("skipped_updates", 0.0)
        out["lr"] = self.scheduler.get_last_lr()[0]
        out.update(correction_metrics)
        out.update(parity.metrics(distributed=self.distributed or self.sharded))
        self.parity_rows = parity.rows()
        return out

    def _accumulating(self, *, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Gradients of a micro-batch that is not its mini-batch's last stay local (no reduce): DDP's
        `no_sync`, FSDP's `set_requires_gradient_sync(False)` (unsharded gradients accumulate until the
        last micro-batch's backward reduce-scatters them)."""
        if self.sharded:
            self.module.set_requires_gradient_sync(last)  # type: ignore[operator]
            return contextlib.nullcontext()
        if not self.distributed or last:
            return contextlib.nullcontext()
        return self.module.no_sync()  # type: ignore[operator]

    def _record(self, plain: bool, seconds: float, positions: int) -> None:
        """Time a micro-batch for the forward chooser; sharded replicas then all take rank 0's choice,
        since every replica must run the same forward (the same collectives in the same order)."""
        undecided = self.chooser.choice is None
        self.chooser.record(plain, seconds, positions)
        if self.sharded and undecided and self.chooser.choice is not None:
            choice = torch.tensor([int(self.chooser.choice)], device=collective_device())
            torch.distributed.broadcast(choice, src=0)
            self.chooser.choice = bool(choice.item())

    def _lockstep(self, plan: list[list[torch.Tensor]]) -> list[list[tuple[torch.Tensor, bool]]]:
        """The plan's (rows, real) per micro-batch per mini-batch; sharded replicas pad theirs to the
        group's largest counts.

        Every forward and backward of a sharded model is collective, so every replica must run as many
        mini-batches, and micro-batches in each, as the others (token budgets or uneven shards can give
        them different counts). A replica short of one repeats a micro-batch it has, marked not real: it
        runs with loss weight 0, contributes no gradient and no metrics. Unsharded plans pass unchanged."""
        steps = [[(rows, True) for rows in parts] for parts in plan]
        if not self.sharded or torch.distributed.get_world_size() == 1:
            return steps
        device = collective_device()
        minis = torch.tensor([len(steps)], device=device)
        torch.distributed.all_reduce(minis, op=torch.distributed.ReduceOp.MAX)
        steps += [[] for _ in range(int(minis.item()) - len(steps))]
        micros = torch.tensor([len(parts) for parts in steps], device=device)
        torch.distributed.all_reduce(micros, op=torch.distributed.ReduceOp.MAX)
        stand_in = next(rows for parts in plan for rows in reversed(parts))
        for parts, wanted in zip(steps, micros.tolist(), strict=True):
            parts += [(parts[-1][0] if parts else stand_in, False)] * (wanted - len(parts))
        return steps

    def _loss(self, mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
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
        return loss, metrics, logprobs.detach()


def _synced(began: float) -> float:
    """Seconds since `began`, after the GPU (if any) finished what was queued."""
    synchronize()
    return time.perf_counter() - began


def rollout_state_dict(model: nn.Module) -> dict[str, Any]:
    """The weights rollout workers need, detached: for a LoRA model only the trainable adapter tensors,
    under the same names the rollout side's own LoRA model uses (its state_dict keys).

    A sharded (fsdp) model's weights must be gathered by every replica together (`LearnerGroup.weights`)."""
    if is_sharded(model):
        raise ValueError(
            "model: its weights are sharded over the learner replicas (fsdp); every replica must gather "
            "them together (LearnerGroup.weights)"
        )
    if is_lora(model):
        return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in model.state_dict().items()}
