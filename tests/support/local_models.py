"""Model folders built offline (no hub at test time): a tiny LlamaForCausalLM that any `--model PATH`
accepts, and a tiny reward model (one score head, as the reward stage saves it) that
`data.rewardModel.path` accepts, each with the character tokenizer, saved with save_pretrained."""

from __future__ import annotations

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
