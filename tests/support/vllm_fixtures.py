"""What the vllm backend tests build the engine from: a tiny Llama with tied embeddings (like SmolLM2),
the case the weight export and the engine's re-tying must get right; and a stand-in `vllm` module for
tests that drive the backend against a fake engine."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

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


def install_fake_vllm(monkeypatch: Any, llm: type, sampling_params: type) -> None:
    """`import vllm` gives a module whose LLM and SamplingParams are the test's stand-ins (for this test
    only: `monkeypatch` takes it back); `llm.made` starts empty."""
    module = types.ModuleType("vllm")
    module.LLM = llm  # type: ignore[attr-defined]
    module.SamplingParams = sampling_params  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    llm.made = []  # type: ignore[attr-defined]
