"""Model loading, the offline tokenizer, checkpoints, LoRA and per-token log-probs.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from decentralized_verl.errors import ModelError
from decentralized_verl.models.loading import (
    load_causal_lm,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_hf_dir,
)
from decentralized_verl.models.logprobs import sequence_logprobs
from decentralized_verl.models.lora import trainable_state_dict
from decentralized_verl.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer, char_vocabulary
from decentralized_verl.spec import LoraSpec, ModelSpec, TinyModelSpec
from decentralized_verl.training.checkpoints.folders import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

torch.set_num_threads(1)


def tiny_spec(**kwargs) -> ModelSpec:
    return ModelSpec(
        tiny=TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), **kwargs
    )


# ------------------------------------------------------------------------------------------- tokenizer
def test_char_tokenizer_round_trips_text_and_is_deterministic():
    tok = build_char_tokenizer()
    text = "Hello, world!\n\tx = 3 * (4 + 5) // 2; {ok} ~`|"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert char_vocabulary() == build_char_tokenizer().get_vocab() == tok.get_vocab()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert (
        tok.decode([tok.bos_token_id, *tok("ab")["input_ids"], tok.eos_token_id], skip_special_tokens=True)
        == "ab"
    )


def test_char_tokenizer_chat_template_padding_and_save_load(tmp_path):
    tok = build_char_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|system|>\nBe brief.</s>\n<|user|>\n2+2?</s>\n<|assistant|>\n"
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|system|>") and ids[-2] == tok.convert_tokens_to_ids(
        "<|assistant|>"
    )
    batch = tok(["a", "abc"], padding=True)
    assert batch["input_ids"][0] == [0, 0, tok.convert_tokens_to_ids("a")]  # left padding for generation
    assert batch["attention_mask"][0] == [0, 0, 1]
    assert build_char_tokenizer(padding_side="right")(["a", "abc"], padding=True)["attention_mask"][0] == [
        1,
        0,
        0,
    ]
    with pytest.raises(ValueError, match="padding_side"):
        build_char_tokenizer(padding_side="middle")
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.get_vocab() == tok.get_vocab() and again.chat_template == CHAT_TEMPLATE
    assert again(rendered, add_special_tokens=False)["input_ids"] == ids
    assert again.decode(ids) == rendered


# ------------------------------------------------------------------------------------------ tiny model
def test_tiny_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = load_causal_lm(tiny_spec())
    assert torch.equal(torch.rand(1), expected_next)  # building did not consume the caller's RNG
    b = load_causal_lm(tiny_spec())
    c = load_causal_lm(
        ModelSpec(tiny=TinyModelSpec(hidden_size=32, num_layers=2, intermediate_size=64, seed=1))
    )
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.hidden_size == 32 and a.config.num_hidden_layers == 2 and a.config.vocab_size == 104
    half = load_causal_lm(tiny_spec(dtype="bfloat16"))
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------- log-probs
def slow_logprobs(model, rows: list[list[int]], temperature: float) -> list[list[float]]:
    """One unpadded forward per prefix: log p(row[t] | row[:t]) for t >= 1."""
    out = []
    with torch.no_grad():
        for row in rows:
            values = [0.0]
            for t in range(1, len(row)):
                logits = model(torch.tensor([row[:t]])).logits[0, -1].double() / temperature
                values.append(float(torch.log_softmax(logits, -1)[row[t]]))
            out.append(values)
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_sequence_logprobs_matches_a_per_token_loop(side):
    model = load_causal_lm(tiny_spec()).eval()
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, 104, (n,), generator=gen).tolist() for n in (7, 3, 5)]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros_like(ids)
    offsets = []
    for i, row in enumerate(rows):
        start = width - len(row) if side == "left" else 0
        offsets.append(start)
        ids[i, start : start + len(row)] = torch.tensor(row)
        attention[i, start : start + len(row)] = 1
        response[i, start + 1 : start + len(row)] = 1  # every real token after the first
    response[0, offsets[0] + 2] = 0  # a hole in the response mask
    with torch.no_grad():
        got = sequence_logprobs(model, ids, attention, response, temperature=0.7)
    expected = slow_logprobs(model, rows, 0.7)
    for i, row in enumerate(rows):
        for t in range(len(row)):
            masked = response[i, offsets[i] + t] == 0
            want = 0.0 if masked else expected[i][t]
            assert got[i, offsets[i] + t].item() == pytest.approx(want, abs=1e-4), (i, t)
    assert torch.all(got[attention == 0] == 0)
    with pytest.raises(ValueError, match="same shape"):
        sequence_logprobs(model, ids, attention, response[:, :-1])


# ----------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_save_load_equality_and_latest(tmp_path):
    model, tok = load_model_and_tokenizer(tiny_spec())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    optimizer.step()
    path = save_checkpoint(
        checkpoint_dir(tmp_path, 3), model, tok, {"step": 3, "note": "x"}, optimizer.state_dict()
    )
    assert (path / "model.safetensors").is_file() and (path / "trainer_state.json").is_file()
    loaded = load_checkpoint(path)
    for (name, x), (_, y) in zip(model.state_dict().items(), loaded.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert loaded.extra_state == {"step": 3, "note": "x"}
    assert torch.equal(
        loaded.optimizer_state["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
    assert loaded.tokenizer.get_vocab() == tok.get_vocab() and loaded.tokenizer.padding_side == "left"
    # a same-named save replaces the old one only when complete; temp folders are never "latest"
    save_checkpoint(checkpoint_dir(tmp_path, 10), model, tok, {"step": 10})
    save_checkpoint(checkpoint_dir(tmp_path, 10), model, tok, {"step": 10, "again": True})
    (tmp_path / ".tmp-checkpoint-99-1-abc").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    assert json.loads((checkpoint_dir(tmp_path, 10) / "trainer_state.json").read_text())["again"] is True
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".tmp-checkpoint-99-1-abc"
    ]
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(ModelError, match=r"config\.json"):
        load_checkpoint(tmp_path / "checkpoint-x")


def test_lora_adapters_train_alone_and_survive_a_checkpoint(tmp_path):
    lora = LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    plain = load_causal_lm(tiny_spec())
    model, tok = load_model_and_tokenizer(tiny_spec(lora=lora))
    ids = torch.tensor([[8, 9, 10, 11]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, plain(ids).logits)  # B = 0: unchanged at start
    adapters = trainable_state_dict(model)
    assert adapters and all("lora_" in k for k in adapters)
    assert set(trainable_state_dict(plain)) == set(plain.state_dict())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
        trained = model(ids).logits
    path = save_checkpoint(tmp_path / "checkpoint-1", model, tok, {})
    resumed = load_checkpoint(path)
    merged = load_checkpoint(path, merge_lora=True)
    with torch.no_grad():
        assert torch.allclose(resumed.model(ids).logits, trained, atol=1e-5)
        assert torch.allclose(merged.model(ids).logits, trained, atol=1e-5)
    assert set(trainable_state_dict(resumed.model)) == set(adapters)
    assert not any("lora_" in k for k in merged.model.state_dict())
    with pytest.raises(ModelError, match=r"spec.model.lora.targetModules: .*nope"):
        load_causal_lm(tiny_spec(lora=LoraSpec(target_modules=["nope"])))


# ---------------------------------------------------------------------------------------------- errors
def test_missing_sources_name_the_field(tmp_path):
    with pytest.raises(ModelError, match=r"spec\.model\.path: .* is not a directory"):
        load_tokenizer(ModelSpec(path=str(tmp_path / "absent")))
    with pytest.raises(ModelError, match=r"spec\.model: .* has no \.gguf file"):
        resolve_hf_dir(ModelSpec(path=str(tmp_path)))
    with pytest.raises(ModelError, match=r"spec\.model\.package: .*'no-such-model-pkg' is not installed"):
        load_causal_lm(ModelSpec(package="no-such-model-pkg"))
    with pytest.raises(ModelError, match=r"spec\.model: package 'pytest' has no \.gguf file"):
        load_causal_lm(ModelSpec(package="pytest"))
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(
        ModelError, match=r"several \.gguf files \(a\.gguf, b\.gguf\); set spec\.model\.ggufFile"
    ):
        resolve_hf_dir(ModelSpec(path=str(tmp_path)))
    with pytest.raises(ModelError, match=r"role\.model\.ggufFile: 'c\.gguf' not found"):
        resolve_hf_dir(ModelSpec(path=str(tmp_path), gguf_file="c.gguf"), field="role.model")
