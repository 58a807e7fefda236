"""Checkpoints of a QLoRA learner keep the adapters and optimizer state only, the 4-bit base named by digest;
a resume puts them back on the same base (and refuses another), and an export merges them into the base in
full precision, in the base's dtype."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.checkpoints.adapters import BASE_FILE, base_digest
from decentralized_verl.training.checkpoints.learner import CheckpointWriter, restore_latest
from decentralized_verl.training.checkpoints.sharded import export_hf

TINY = {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}


def spec_of(kind: str = "nf4", dtype: str = "bfloat16"):
    return parse_spec(
        {
            "model": {
                "tiny": TINY,
                "dtype": dtype,
                "lora": {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]},
                "quantization": {"type": kind},
            },
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl"},
        }
    )


def trainer_of(model: torch.nn.Module) -> SimpleNamespace:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler)


def train_a_step(trainer: SimpleNamespace) -> None:
    ids = torch.randint(3, 20, (2, 10))
    trainer.model(input_ids=ids, labels=ids).loss.backward()
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad()


def adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def checkpoint(tmp_path: Path, spec) -> tuple[Path, SimpleNamespace, object]:
    model, tokenizer = load_model_and_tokenizer(spec.model)
    trainer = trainer_of(model)
    for _ in range(2):
        train_a_step(trainer)
    writer = CheckpointWriter(tmp_path / "ckpt", trainer, tokenizer, keep=2)
    state = {"step": 2, "policy_version": 2, "sampler": {"epoch": 0, "offset": 4}}
    folder = writer.take(2, state)
    writer.close()
    return folder, trainer, tokenizer


def test_a_checkpoint_holds_adapters_and_optimizer_only(tmp_path: Path) -> None:
    folder, trainer, _ = checkpoint(tmp_path, spec_of())
    assert not list(folder.glob("*.safetensors"))  # no base weights at the top
    assert (folder / "adapter" / "adapter_model.safetensors").is_file()
    assert (folder / "optimizer.pt").is_file()
    base = (folder / BASE_FILE).read_text()
    assert base_digest(trainer.model) in base and '"type": "nf4"' in base
    saved = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    assert saved and all("lora_" in name for name in saved)
    adapter_bytes = sum(t.numel() * t.element_size() for t in saved.values())
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert total < adapter_bytes * 4 + 200_000  # tokenizer and optimizer state, never the base


def test_resume_puts_the_adapters_and_optimizer_back(tmp_path: Path) -> None:
    spec = spec_of()
    folder, trainer, _ = checkpoint(tmp_path, spec)
    model, _ = load_model_and_tokenizer(spec.model)
    fresh = trainer_of(model)
    point = restore_latest(fresh, tmp_path / "ckpt")
    assert point is not None and point.step == 2 and point.folder == folder
    ours, theirs = adapters(model), adapters(trainer.model)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    assert fresh.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()
    train_a_step(fresh)  # and training continues from there
    train_a_step(trainer)


def test_resume_on_another_base_is_refused(tmp_path: Path) -> None:
    checkpoint(tmp_path, spec_of("nf4"))
    other, _ = load_model_and_tokenizer(spec_of("fp4").model)
    with pytest.raises(CheckpointError, match="trained on base"):
        restore_latest(trainer_of(other), tmp_path / "ckpt")


def test_export_merges_into_the_full_precision_base_in_its_dtype(tmp_path: Path) -> None:
    spec = spec_of(dtype="bfloat16")
    folder, trainer, _ = checkpoint(tmp_path, spec)
    out = export_hf(folder, tmp_path / "export", model_spec=spec.model)
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert merged.dtype == torch.bfloat16
    assert not any("Linear4bit" in type(m).__name__ for m in merged.modules())
    plain = spec.model.model_copy(update={"lora": None, "quantization": None})
    base, _ = load_model_and_tokenizer(plain)
    trained = adapters(trainer.model)
    a = trained["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"]
    b = trained["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"]
    delta = (b.float() @ a.float()) * (8 / 4)
    got = merged.model.layers[0].self_attn.q_proj.weight.float()
    want = (base.model.layers[0].self_attn.q_proj.weight.float() + delta).to(torch.bfloat16).float()
    assert delta.abs().max() > 0
    assert torch.allclose(got, want, atol=1e-2)


def test_export_of_an_adapter_checkpoint_needs_the_job(tmp_path: Path) -> None:
    folder, _, _ = checkpoint(tmp_path, spec_of())
    with pytest.raises(CheckpointError, match=r"job\.yaml"):
        export_hf(folder, tmp_path / "export")
