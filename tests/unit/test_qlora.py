"""QLoRA: a 4-bit base (bitsandbytes NF4/FP4) with LoRA adapters on top. The spec refuses what cannot work by
field; the loaded model keeps the base in 4 bits and trains only the adapters; the reference is the same
base with the adapters off; only adapters reach a rollout worker holding the same 4-bit base."""

from __future__ import annotations

import copy

import bitsandbytes as bnb
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file as load_tensors

from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.backends.vllm_lora import (
    engine_dtype,
    hot_swaps_adapters,
    lora_engine_kwargs,
    write_adapter,
)
from decentralized_verl.backends.vllm_weights import export_state_dict
from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.errors import ManifestError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.models.lora import base_only
from decentralized_verl.models.quantization import is_quantized
from decentralized_verl.orchestration.wiring import _local_reference
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.scoring import ReferenceWorker
from decentralized_verl.spec.manifest import parse_job, parse_spec
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport.weights.codec import WeightAssembler, encode_state_dict
from tests.support.job_manifests import SMALL_JOB

TINY = {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}
LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}


def qlora_spec(kind: str = "nf4", double: bool = True):
    return parse_spec(
        {
            "model": {
                "tiny": TINY,
                "lora": LORA,
                "quantization": {"type": kind, "doubleQuant": double},
            },
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl"},
            "roles": {"reference": {"replicas": 0}},
            "training": {"batchSize": 2},
        }
    )


def problems_of(doc: dict) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def job_with(**model: object) -> dict:
    doc = copy.deepcopy(SMALL_JOB)
    doc["spec"]["model"].update(model)
    return doc


def test_quantization_defaults_are_qlora_s() -> None:
    spec = qlora_spec()
    q = spec.model.quantization
    assert (q.bits, q.type, q.compute_dtype, q.double_quant) == (4, "nf4", None, True)


def test_quantization_without_lora_is_refused_by_field() -> None:
    found = problems_of(job_with(quantization={}))
    assert any(p.startswith("spec.model.quantization:") and "model.lora" in p for p in found), found


@pytest.mark.parametrize(
    ("quantization", "field"),
    [
        ({"bits": 8}, "spec.model.quantization.bits"),
        ({"type": "int4"}, "spec.model.quantization.type"),
        ({"computeDtype": "float64"}, "spec.model.quantization.computeDtype"),
        ({"blockSize": 128}, "spec.model.quantization.blockSize"),
        ({"doubleQuant": "sometimes"}, "spec.model.quantization.doubleQuant"),
    ],
)
def test_bad_quantization_fields_are_named(quantization: dict, field: str) -> None:
    found = problems_of(job_with(lora={}, quantization=quantization))
    assert any(p.startswith(field) for p in found), found


def test_a_critic_model_in_four_bits_is_refused() -> None:
    doc = job_with(lora={}, quantization={})
    doc["spec"]["algorithm"] = {"name": "ppo", "samplesPerPrompt": 1}
    doc["spec"]["roles"]["critic"] = {"replicas": 1, "model": {"tiny": {}, "quantization": {}}}
    found = problems_of(doc)
    assert any(p.startswith("spec.roles.critic.model.quantization:") for p in found), found


def test_qlora_with_fsdp_or_spans_is_refused() -> None:
    doc = job_with(lora={}, quantization={})
    doc["spec"]["roles"]["learner"]["sharding"] = "fsdp"
    found = problems_of(doc)
    assert any(p.startswith("spec.roles.learner.sharding") and "lora" in p for p in found), found


@pytest.mark.parametrize("kind", ["nf4", "fp4"])
def test_the_base_is_four_bit_and_only_adapters_train(kind: str) -> None:
    model, _ = load_model_and_tokenizer(qlora_spec(kind).model)
    assert is_quantized(model)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(m.weight.quant_type == kind for m in layers)
    assert model.get_output_embeddings().weight.dtype == torch.float32  # the head stays full precision
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.randint(3, 20, (2, 12))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_four_bit_weights_are_a_quarter_of_fp32_or_less() -> None:
    plain_spec = qlora_spec().model.model_copy(update={"quantization": None})
    plain, _ = load_model_and_tokenizer(plain_spec)
    quantized, _ = load_model_and_tokenizer(qlora_spec().model)

    def linear_bytes(model: torch.nn.Module) -> int:
        return sum(
            t.numel() * t.element_size()
            for name, t in model.state_dict().items()
            if "layers." in name and "norm" not in name and "lora_" not in name
        )

    assert linear_bytes(quantized) * 4 < linear_bytes(plain)  # tiny layers: per-layer quant state weighs


def _samples(n: int = 3) -> list[Sample]:
    return [
        Sample(
            prompt=Prompt(prompt_id=f"p{i}", group=i, token_ids=(5, 6, 7 + i), text=""),
            sample_index=0,
            response_ids=(8, 9, 10 + i, 11),
            logprobs=(0.0,) * 4,
            finish_reason="stop",
            text="",
            policy_version=0,
        )
        for i in range(n)
    ]


def _move_adapters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.3)


def test_colocated_reference_is_the_learner_s_own_base_with_adapters_off() -> None:
    spec = qlora_spec()
    learner, tokenizer = load_model_and_tokenizer(spec.model)
    learner.train()
    client = _local_reference(spec, learner, tokenizer, 1.0)
    worker = client.worker
    assert worker.model is learner  # one copy of the 4-bit base in this process
    before = worker.logprobs(_samples())
    _move_adapters(learner)
    after = worker.logprobs(_samples())
    assert after == before  # the adapters' change does not reach the reference
    assert learner.training  # the learner's mode is given back
    assert any(p.requires_grad for p in learner.parameters())
    remote = ReferenceWorker.from_spec(spec)  # a reference of its own: the same 4-bit base, no adapters
    assert is_quantized(remote.model)
    theirs = remote.logprobs(_samples())
    for ours_row, theirs_row in zip(after, theirs, strict=True):
        assert ours_row == pytest.approx(theirs_row, abs=1e-5)


def test_adapters_off_differs_from_the_trained_policy() -> None:
    model, _ = load_model_and_tokenizer(qlora_spec().model)
    _move_adapters(model)
    ids = torch.randint(3, 20, (1, 10))
    with torch.no_grad():
        policy = model(input_ids=ids).logits
        with base_only(model):
            base = model(input_ids=ids).logits
    assert not torch.allclose(policy, base)


@pytest.mark.parametrize("kind", ["nf4", "fp4"])
def test_adapter_only_update_reaches_a_qlora_rollout_worker(kind: str) -> None:
    spec = qlora_spec(kind)
    learner, tokenizer = load_model_and_tokenizer(spec.model)
    rollout_model, _ = load_model_and_tokenizer(spec.model)
    _move_adapters(learner)
    update = rollout_state_dict(learner)
    assert update and all("lora_" in name for name in update)
    bundle = encode_state_dict(update, 1, dtype=None)
    whole = sum(t.numel() * t.element_size() for t in learner.state_dict().values())
    assert bundle.header.total_bytes * 10 < whole  # adapters only, not the base
    assembler = WeightAssembler(bundle.header)
    for chunk in bundle.chunks:
        assembler.add(chunk)
    worker = RolloutWorker(HFBackend(rollout_model, tokenizer), "r0")
    worker.load_weights(assembler.finish(), 1)
    assert worker.version == 1
    theirs = rollout_model.state_dict()
    for name, tensor in learner.state_dict().items():
        assert torch.equal(theirs[name], tensor), name
    ids = torch.randint(3, 20, (2, 9))
    learner.eval()  # bitsandbytes' training-mode path rounds differently (docs/qlora.md measures it)
    with torch.no_grad():
        assert torch.equal(rollout_model(input_ids=ids).logits, learner(input_ids=ids).logits)


def test_adapters_below_get_gradients_after_the_model_served_a_no_grad_forward() -> None:
    """A learner's model also serves its colocated reference and rollout (eval mode, no grad); the 4-bit
    layers must keep the path whose backward reaches every adapter."""
    model, _ = load_model_and_tokenizer(qlora_spec().model)
    ids = torch.randint(3, 20, (2, 12))
    with torch.no_grad(), base_only(model):
        model(input_ids=ids)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    _move_adapters(model)  # B != 0 now; a second backward reaches every A and B
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    missing = [
        n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())
    ]
    assert not missing, missing


def test_vllm_gets_the_base_alone_dequantized_and_lora_engine_settings(tmp_path) -> None:
    """What the vllm backend hands vLLM for a 4-bit base: a plain checkpoint of the base (its 4-bit weights
    dequantized, no quantization state, no adapters), engine settings for LoRA, and each
    version's adapters as a PEFT folder."""
    spec = qlora_spec()
    model, _ = load_model_and_tokenizer(spec.model)
    _move_adapters(model)
    assert hot_swaps_adapters(model) and engine_dtype(model) == torch.float32
    assert lora_engine_kwargs(model) == {  # no quantization: the base is served dequantized
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 1,
    }
    base = export_state_dict(model, merge_adapters=False)
    assert not any("lora_" in n or "absmax" in n or "quant" in n or "base_layer" in n for n in base)
    q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    weight = base["model.layers.0.self_attn.q_proj.weight"]
    assert weight.shape == (64, 64) and weight.dtype == torch.float32
    with torch.no_grad():  # the dequantized weight is what the 4-bit layer computes with
        x = torch.randn(3, 64)
        assert torch.allclose(q(x), x @ weight.T, atol=1e-5)
    merged = export_state_dict(model)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], weight)
    folder = write_adapter(model, tmp_path / "adapter-v1")
    saved = load_tensors(str(folder / "adapter_model.safetensors"))
    assert saved and all("lora_" in n for n in saved)
    plain = spec.model.model_copy(update={"lora": None})
    again = PeftModel.from_pretrained(load_model_and_tokenizer(plain)[0], folder)
    ids = torch.randint(3, 20, (1, 8))
    model.eval()
    with torch.no_grad():
        assert torch.allclose(again(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
