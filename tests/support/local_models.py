"""Model folders built offline (no hub at test time): a tiny LlamaForCausalLM that any `--model PATH`
accepts, and a tiny reward model (one score head, as the reward stage saves it) that
`data.rewardModel.path` accepts, each with the character tokenizer, saved with save_pretrained."""

from __future__ import annotations

import json
from pathlib import Path


def save_tiny_model(folder: Path, head: str = "causal_lm") -> Path:
    from decentralized_verl.models.tiny import build_tiny, tiny_config
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.spec import TinyModelSpec

    tokenizer = build_char_tokenizer()
    tiny = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    config = tiny_config(tiny, tokenizer)
    if head == "sequence_classification":
        config.num_labels = 1  # one score a sequence
    build_tiny(config, seed=0, head=head).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_tiny_reward_model(folder: Path) -> Path:
    """What examples/stages.yaml's reward stage leaves in its outputDir, in small."""
    return save_tiny_model(folder, head="sequence_classification")


def bake_packages(into: Path, *packages: str) -> Path:
    """What the worker image's build does (Dockerfile: `python -m decentralized_verl.models.bake`), into
    a host folder a node binds at the image's IMAGE_MODELS_DIR; kept when already made."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "decentralized_verl.models.bake", "--into", str(into), *packages]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return into


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_tiny_qwen2(folder: Path, tokenizer_from: Path, head_dim: int = 64) -> Path:
    """A tiny stand-in for a Qwen2.5 checkpoint (Qwen2ForCausalLM: 2 layers, 2 query heads of `head_dim`
    with one key/value head, biased q/k/v as Qwen2 has), with the tokenizer and chat template of the
    model package at `tokenizer_from` (its vocabulary sizes the embedding), saved in bfloat16 as
    Qwen's checkpoints are. vLLM's CPU attention takes only some head sizes (64, 128, ...)."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    source = json.loads((tokenizer_from / "config.json").read_text())
    config = Qwen2Config(
        vocab_size=source["vocab_size"],
        hidden_size=2 * head_dim,
        intermediate_size=4 * head_dim,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=source.get("bos_token_id"),
        eos_token_id=source.get("eos_token_id"),
        pad_token_id=source.get("pad_token_id"),
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    for path in folder.iterdir():
        path.chmod(0o644)  # readable by the workers' user (safetensors writes 0600)
    folder.chmod(0o755)
    return folder
