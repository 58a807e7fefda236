"""What both trained stages share: the result type, the optimiser step loop and the final save."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from decentralized_verl.models.lora import is_lora
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.stages.batching import batch_indices, planned_steps
from decentralized_verl.stages.config import TrainingStage
from decentralized_verl.training.checkpoints.folders import checkpoint_dir, save_checkpoint
from decentralized_verl.training.optimizer_step import optimizer_step


@dataclass
class StageResult:
    stage: str
    checkpoint: Path | None
    metrics: dict[str, Any] = field(default_factory=dict)
    stages: list[StageResult] = field(default_factory=list)


def train(
    model: torch.nn.Module,
    tokenizer: Any,
    section: TrainingStage,
    n_examples: int,
    loss_fn: Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]],
    output_dir: Path,
    log: MetricsLog,
    extra_state: dict[str, Any],
) -> tuple[int, list[float]]:
    """AdamW over seeded shuffled batches; returns (steps taken, per-step losses).

    `loss_fn(indices)` gives the batch loss and extra numbers to log. Intermediate checkpoints every
    `saveEvery` steps carry the optimiser state so a run can be inspected or resumed.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=section.learning_rate, weight_decay=section.weight_decay)
    total = planned_steps(n_examples, section.batch_size, section.epochs, section.max_steps)
    batches = batch_indices(n_examples, section.batch_size, section.epochs, section.seed, section.max_steps)
    losses: list[float] = []
    model.train()
    step = 0
    with tqdm(total=total, desc=log.stage, unit="step", leave=False) as bar:
        for epoch, indices in batches:
            loss, extra = loss_fn(indices)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = optimizer_step(optimizer, params, max_grad_norm=section.max_grad_norm).grad_norm
            step += 1
            losses.append(float(loss.detach()))
            log.write({"step": step, "epoch": epoch, "loss": losses[-1], "grad_norm": grad_norm, **extra})
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            bar.update(1)
            if section.save_every and step % section.save_every == 0 and step < total:
                state = {**extra_state, "step": step, "epoch": epoch}
                save_checkpoint(
                    checkpoint_dir(output_dir, step), model, tokenizer, state, optimizer.state_dict()
                )
    model.eval()
    return step, losses


def save_final(
    model: torch.nn.Module, tokenizer: Any, output_dir: Path, step: int, state: dict[str, Any]
) -> Path:
    """The stage's output: a plain HF model (LoRA merged in) that the next stage loads as is."""
    plain = model.merge_and_unload() if is_lora(model) else model
    return save_checkpoint(checkpoint_dir(output_dir, step), plain, tokenizer, {**state, "step": step})
