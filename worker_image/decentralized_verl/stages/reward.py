"""Pairwise reward-model training (Bradley-Terry): the chosen response should outscore the rejected one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from decentralized_verl.core.samples import position_ids_from_mask
from decentralized_verl.data.dataset import load_preferences
from decentralized_verl.errors import ModelError
from decentralized_verl.models.loading import load_sequence_classifier
from decentralized_verl.models.lora import apply_lora
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.stages.batching import encode_scored, pad
from decentralized_verl.stages.common import StageResult, save_final, train
from decentralized_verl.stages.config import TrainConfig
from decentralized_verl.training.checkpoints.folders import latest_checkpoint

Pairs = list[tuple[list[int], list[int]]]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(r_chosen - r_rejected), averaged over pairs."""
    return -F.logsigmoid(chosen - rejected).mean()


def sequence_scores(model: torch.nn.Module, rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """[B] scalar scores; rows are left-padded so the classifier reads each row's real last token."""
    ids, attention = pad(rows, pad_id, side="left")
    out = model(input_ids=ids, attention_mask=attention, position_ids=position_ids_from_mask(attention))
    return out.logits[:, 0].float()


@torch.no_grad()
def score_texts(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    responses: list[str],
    fmt: str,
    max_length: int,
) -> torch.Tensor:
    """Reward-model scores for (prompt, response) pairs, laid out exactly as in training."""
    rows = [encode_scored(tokenizer, p, r, fmt, max_length) for p, r in zip(prompts, responses, strict=True)]
    return sequence_scores(model, rows, tokenizer.pad_token_id)


def _pair_scores(model: torch.nn.Module, pairs: Pairs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen and rejected scored in one forward pass (same padding, same batch statistics)."""
    scores = sequence_scores(model, [c for c, _ in pairs] + [r for _, r in pairs], pad_id)
    return scores[: len(pairs)], scores[len(pairs) :]


@torch.no_grad()
def pair_accuracy(model: torch.nn.Module, pairs: Pairs, pad_id: int, batch_size: int) -> float:
    """Fraction of pairs where chosen scores strictly higher (a tie counts as wrong)."""
    right = 0
    for start in range(0, len(pairs), batch_size):
        chosen, rejected = _pair_scores(model, pairs[start : start + batch_size], pad_id)
        right += int((chosen > rejected).sum())
    return right / len(pairs)


def reward_init_source(config: TrainConfig) -> Path | Any:
    """The SFT output when asked for (or, with `auto`, when one exists), else the base model spec."""
    section = config.reward
    assert section is not None
    sft_checkpoint = latest_checkpoint(config.resolve(config.sft.output_dir)) if config.sft else None
    if section.init_from == "sft" and sft_checkpoint is None:
        where = config.resolve(config.sft.output_dir) if config.sft else "(no sft section)"
        raise ModelError(
            f"reward.initFrom: 'sft' but sft.outputDir {str(where)!r} has no checkpoint-N folder"
        )
    if section.init_from != "base" and sft_checkpoint is not None:
        return sft_checkpoint
    return config.model


def run_reward(config: TrainConfig) -> StageResult:
    section = config.reward
    assert section is not None
    torch.manual_seed(section.seed)
    source = reward_init_source(config)
    model, tokenizer = load_sequence_classifier(source, field="model")
    if config.model.lora is not None:
        model = apply_lora(model, config.model.lora, field="model.lora", modules_to_save=["score"])
    pad_id = tokenizer.pad_token_id

    def encode(path: str) -> Pairs:
        fmt, limit = section.format, section.max_length
        return [
            (
                encode_scored(tokenizer, r.prompt, r.chosen, fmt, limit),
                encode_scored(tokenizer, r.prompt, r.rejected, fmt, limit),
            )
            for r in load_preferences(config.resolve(path))
        ]

    train_set = encode(section.train_file)
    eval_set = encode(section.eval_file) if section.eval_file else []
    output_dir = config.resolve(section.output_dir)
    log = MetricsLog(output_dir / "metrics.jsonl", stage="reward")

    def accuracies(when: str) -> dict[str, float]:
        out = {f"train_accuracy_{when}": pair_accuracy(model, train_set, pad_id, section.batch_size)}
        if eval_set:
            out[f"eval_accuracy_{when}"] = pair_accuracy(model, eval_set, pad_id, section.batch_size)
        return out

    model.eval()
    before = accuracies("before")
    log.write({"step": 0, **before})

    def loss_fn(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = _pair_scores(model, [train_set[i] for i in indices], pad_id)
        accuracy = float((chosen > rejected).float().mean())
        return bradley_terry_loss(chosen, rejected), {"batch_accuracy": accuracy}

    init = str(source) if isinstance(source, Path) else "base"
    state = {"stage": "reward", "format": section.format, "init_from": init}
    steps, losses = train(model, tokenizer, section, len(train_set), loss_fn, output_dir, log, state)
    after = accuracies("after")
    log.write({"step": steps, **after})
    log.close()
    metrics = {**before, **after, "steps": steps, "first_loss": losses[0], "last_loss": losses[-1]}
    path = save_final(model, tokenizer, output_dir, steps, {**state, "metrics": metrics})
    return StageResult("reward", path, metrics)
