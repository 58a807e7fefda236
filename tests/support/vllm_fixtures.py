"""What the vllm backend tests build the engine from: a tiny Llama with tied embeddings (like SmolLM2),
the case the weight export and the engine's re-tying must get right."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.models.tokenizer import build_char_tokenizer


def tiny_tied_model(
    *,
    hidden_size: int,
    num_layers: int,
    intermediate_size: int,
    max_positions: int,
    num_heads: int = 2,
    seed: int = 0,
) -> tuple[torch.nn.Module, object]:
    """An fp32 Llama in eval mode whose LM head is the embedding matrix, and the char tokenizer."""
    tokenizer = build_char_tokenizer()
    spec = SimpleNamespace(
        architecture="llama",
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
    )
    config = tiny_config(spec, tokenizer)
    config.tie_word_embeddings = True
    model = build_tiny(config, seed).float().eval()
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model, tokenizer
