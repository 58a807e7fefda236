"""The tiny Llama built from a spec: same weights on every machine for the same seed, no downloads."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerBase,
)

from decentralized_verl.errors import ModelError


def tiny_config(
    tiny: Any, tokenizer: PreTrainedTokenizerBase, *, field: str = "spec.model.tiny"
) -> LlamaConfig:
    """A LlamaConfig with the spec's sizes and the tokenizer's vocabulary and special ids."""
    if tiny.architecture != "llama":
        raise ModelError(f"{field}.architecture: only 'llama' is supported (got {tiny.architecture!r})")
    if tiny.hidden_size % tiny.num_heads:
        raise ModelError(
            f"{field}.hiddenSize: must be divisible by numHeads ({tiny.hidden_size} % {tiny.num_heads} != 0)"
        )
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        max_position_embeddings=tiny.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )


def build_tiny(config: LlamaConfig, seed: int, *, head: str = "causal_lm") -> torch.nn.Module:
    """Initialise from `seed` without disturbing the caller's global RNG (fork_rng restores it)."""
    cls = {"causal_lm": LlamaForCausalLM, "sequence_classification": LlamaForSequenceClassification}[head]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config)
