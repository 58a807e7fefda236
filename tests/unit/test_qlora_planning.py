"""The planner's 4-bit base (model.quantization): its weights as bitsandbytes holds them, a QLoRA 7B GRPO job
(learner with its reference inside, rollout) fitting 24 GiB cards from a config.json alone, and the
colocated LoRA reference costing no second copy of the weights."""

from __future__ import annotations

import copy

import torch

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.planning import plan_for
from decentralized_verl.planning.devices import GIB
from decentralized_verl.planning.quantized import FourBit, four_bit_bytes
from decentralized_verl.planning.report import render
from decentralized_verl.planning.shapes import tiny_shape
from decentralized_verl.spec.manifest import load_job, parse_job, parse_spec
from tests.support.job_manifests import QWEN7B_CONFIG, qwen7b
from tests.support.paths import ROOT

LORA = {"rank": 16, "alpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
QLORA = {"type": "nf4", "doubleQuant": True}


def consumer_job(quantization: dict | None, *, reference_inside: bool = True) -> dict:
    """A 7B GRPO job from Qwen2-7B's config.json alone: learner on a 24 GiB card with its reference inside,
    HF rollout on another 24 GiB card."""
    model = {"path": str(QWEN7B_CONFIG), "lora": LORA}
    if quantization is not None:
        model["quantization"] = quantization
    doc = qwen7b(
        model=model,
        learner={
            "replicas": 1,
            "activationCheckpointing": True,
            "resources": {"gpus": 1, "gpuMemory": "24Gi"},
        },
        rollout={"replicas": 1, "batchSize": 4, "resources": {"gpus": 1, "gpuMemory": "24Gi"}},
        training={"batchSize": 4, "minibatchSize": 4, "microbatchSize": 1},
    )
    doc["spec"]["roles"]["reference"] = {"replicas": 0 if reference_inside else 1}
    doc["spec"]["algorithm"]["samplesPerPrompt"] = 4
    doc["spec"]["data"]["maxNewTokens"] = 512
    return doc


def workers(doc: dict) -> dict:
    return {w.role: w for w in plan_for(parse_job(doc).spec, ROOT).workers}


def component(worker, name: str) -> int:
    return sum(c.bytes for c in worker.estimate.components if c.name == name and c.phase == "always")


def test_four_bit_weights_match_what_bitsandbytes_holds() -> None:
    spec = parse_spec(
        {
            "model": {
                "tiny": {"hiddenSize": 128, "numLayers": 2, "numHeads": 4, "intermediateSize": 256},
                "lora": {"rank": 4},
                "quantization": QLORA,
            },
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl"},
        }
    )
    model, _ = load_model_and_tokenizer(spec.model)
    held = {
        name: t.numel() * t.element_size() for name, t in model.state_dict().items() if "lora_" not in name
    }
    four_bit = sum(size for name, size in held.items() if ".weight" in name and "_proj" in name)
    rest = sum(size for name, size in held.items() if "_proj" not in name)
    tiny = spec.model.tiny
    shape = tiny_shape(
        tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.intermediate_size, tiny.max_positions
    )
    packed, scales, planned_rest = four_bit_bytes(shape, FourBit(double_quant=True, compute_bytes=4))
    assert planned_rest == rest  # embeddings, head and norms in fp32
    # the 4-bit weights and their scales; bitsandbytes' per-layer quant-state record is not counted
    assert packed <= four_bit
    assert abs((packed + scales) - four_bit) <= 0.1 * four_bit, (packed + scales, four_bit)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "norm" in n)


def test_qlora_7b_grpo_fits_24_gib_cards_from_config_json_alone() -> None:
    qlora = workers(consumer_job(QLORA))
    assert {role: w.verdict for role, w in qlora.items()} == {"learner": "fits", "rollout": "fits"}
    learner = qlora["learner"]
    assert learner.estimate.gpu < 24 * GIB
    names = {c.name for c in learner.estimate.components}
    assert {"weights", "gradients", "optimizer", "dequantization", "activations", "logits"} <= names
    # the reference inside the learner computes with the learner's base: a forward, no weights of its own
    inside = [c for c in learner.estimate.components if c.phase.startswith("reference")]
    assert inside and all(c.name != "weights" for c in inside)
    # 4 bits: the weights are well under the bf16 LoRA job's
    lora = workers(consumer_job(None))
    assert component(learner, "weights") < component(lora["learner"], "weights") * 0.6
    assert qlora["rollout"].estimate.gpu < lora["rollout"].estimate.gpu
    # same adapters either way: same gradients and optimizer state
    assert component(learner, "gradients") == component(lora["learner"], "gradients")


def test_a_reference_of_its_own_holds_the_four_bit_base() -> None:
    own = workers(consumer_job(QLORA, reference_inside=False))
    weights = component(own["reference"], "weights")
    assert (
        0 < weights < component(workers(consumer_job(None, reference_inside=False))["reference"], "weights")
    )


def test_dverl_plan_says_what_runs_where_for_the_consumer_example() -> None:
    job = load_job(ROOT / "examples" / "qwen7b-grpo-lora-consumer.yaml")
    assert job.spec.model.quantization is not None and job.spec.roles.reference.replicas == 0
    plan = plan_for(job.spec, None)  # the operator's view: the model known by name, no files
    assert {w.verdict for w in plan.workers} == {"fits"}
    text = render(plan)
    assert "learner also runs reference in its own process" in text
    assert "model.quantization: the base in 4 bits (nf4" in text


def test_without_quantization_the_planner_is_unchanged() -> None:
    doc = consumer_job(None)
    again = copy.deepcopy(doc)
    again["spec"]["model"].pop("lora")
    full = workers(again)["learner"]
    assert component(full, "gradients") > component(workers(doc)["learner"], "gradients")


def test_a_vllm_rollout_holds_the_base_dequantized_at_its_compute_dtype() -> None:
    """The pinned vLLM has no 4-bit loader: its engine serves the base dequantized, so a QLoRA job's vLLM
    rollout holds as many weight bytes as the same job's full-precision one (compute dtype bfloat16), while
    the hf rollout runs the 4-bit layers themselves."""

    def rollout(quantization: dict | None, backend: str):
        doc = consumer_job(quantization)
        doc["spec"]["model"]["dtype"] = "bfloat16"
        doc["spec"]["roles"]["rollout"]["backend"] = backend
        return workers(doc)["rollout"]

    q = {**QLORA, "computeDtype": "bfloat16"}
    vllm_4bit, vllm_plain = rollout(q, "vllm"), rollout(None, "vllm")
    assert component(vllm_4bit, "weights") == component(vllm_plain, "weights") > 14 << 30  # 7.6B x 2 B
    assert component(rollout(q, "hf"), "weights") < component(rollout(None, "hf"), "weights")
