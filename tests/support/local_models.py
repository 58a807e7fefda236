"""A model folder that any `--model PATH` accepts, built offline: a tiny LlamaForCausalLM and the
character tokenizer, saved with save_pretrained (no hub at test time)."""

from __future__ import annotations

from pathlib import Path


def save_tiny_model(folder: Path) -> Path:
    from decentralized_verl.models.tiny import build_tiny, tiny_config
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.spec import TinyModelSpec

    tokenizer = build_char_tokenizer()
    tiny = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    build_tiny(tiny_config(tiny, tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
