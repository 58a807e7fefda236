"""Supervised fine-tuning: learn the completions given the prompts (prompt tokens carry no loss)."""

from __future__ import annotations

from typing import Any

import torch

from decentralized_verl.data.dataset import load_sft
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.models.logprobs import sequence_logprobs
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.stages.batching import encode_completion, pad, pad_values
from decentralized_verl.stages.common import StageResult, save_final, train
from decentralized_verl.stages.config import TrainConfig

Encoded = list[tuple[list[int], list[int]]]


def completion_loss(model: torch.nn.Module, examples: Encoded, pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood over completion tokens of the batch (token-weighted)."""
    ids, attention = pad([e[0] for e in examples], pad_id)
    loss_mask = pad_values([e[1] for e in examples])
    logprobs = sequence_logprobs(model, ids, attention, loss_mask)
    return -logprobs.sum() / loss_mask.sum().clamp(min=1)


@torch.no_grad()
def mean_loss(model: torch.nn.Module, examples: Encoded, pad_id: int, batch_size: int) -> float:
    """Token-weighted mean loss over all `examples` (same weighting as one big batch)."""
    total, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        n = sum(sum(mask) for _, mask in chunk)
        total += float(completion_loss(model, chunk, pad_id)) * n
        tokens += n
    return total / max(tokens, 1)


def run_sft(config: TrainConfig) -> StageResult:
    section = config.sft
    assert section is not None
    torch.manual_seed(section.seed)
    model, tokenizer = load_model_and_tokenizer(config.model, padding_side="right", field="model")
    pad_id = tokenizer.pad_token_id

    def encode(path: str) -> Encoded:
        records = load_sft(config.resolve(path))
        fmt, limit = section.format, section.max_length
        return [encode_completion(tokenizer, r.prompt, r.completion, fmt, limit) for r in records]

    train_set = encode(section.train_file)
    eval_set = encode(section.eval_file) if section.eval_file else []
    output_dir = config.resolve(section.output_dir)
    log = MetricsLog(output_dir / "metrics.jsonl", stage="sft")

    model.eval()
    before: dict[str, Any] = {"train_loss_before": mean_loss(model, train_set, pad_id, section.batch_size)}
    if eval_set:
        before["eval_loss_before"] = mean_loss(model, eval_set, pad_id, section.batch_size)
    log.write({"step": 0, **before})

    def loss_fn(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        return completion_loss(model, [train_set[i] for i in indices], pad_id), {}

    state = {"stage": "sft", "format": section.format}
    steps, _ = train(model, tokenizer, section, len(train_set), loss_fn, output_dir, log, state)
    after: dict[str, Any] = {"train_loss_after": mean_loss(model, train_set, pad_id, section.batch_size)}
    if eval_set:
        after["eval_loss_after"] = mean_loss(model, eval_set, pad_id, section.batch_size)
    log.write({"step": steps, **after})
    log.close()
    metrics = {**before, **after, "steps": steps}
    path = save_final(model, tokenizer, output_dir, steps, {**state, "metrics": metrics})
    return StageResult("sft", path, metrics)
