"""The spec accepts the shipped examples and rejects bad manifests with the field path named."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec import JobSpec, with_defaults
from decentralized_verl.spec.manifest import load_job, parse_job, summary
from tests.support.job_manifests import EXAMPLE_JOBS, SMALL_JOB


def mutate(path: str, value: object) -> dict:
    """SMALL_JOB with one dotted path set (value DELETE removes the key)."""
    doc = copy.deepcopy(SMALL_JOB)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(last)
    else:
        node[last] = value
    return doc


DELETE = object()


def problems_of(doc: object) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("example", EXAMPLE_JOBS, ids=lambda p: p.name)
def test_every_example_is_valid(example: Path) -> None:
    job = load_job(example)
    assert summary(job).startswith(f"RLHFJob {job.metadata.name}: valid")


def test_base_is_valid_and_defaults_round_trip() -> None:
    job = parse_job(SMALL_JOB)
    assert job.spec.algorithm.samples_per_prompt == 4
    assert job.spec.advantage_estimator == "grpo"
    again = JobSpec.model_validate(with_defaults(job.spec))
    assert again == job.spec


INVALID = [
    # (mutation path, value, expected field path in a message, expected words)
    ("spec.bogus", 1, "spec.bogus", "unknown field"),
    ("spec.algorithm.clipLo", 0.1, "spec.algorithm.clipLo", "unknown field"),
    ("spec.roles.rollout.replicas", -1, "spec.roles.rollout.replicas", ">= 0"),
    ("spec.roles.rollout.replicas", "two", "spec.roles.rollout.replicas", "integer"),
    ("spec.roles.learner.replicas", 0, "spec.roles.learner.replicas", ">= 1"),
    ("spec.algorithm.samplesPerPrompt", 0, "spec.algorithm.samplesPerPrompt", "> 0"),
    ("spec.algorithm.samplesPerPrompt", 1, "spec.algorithm.samplesPerPrompt", ">= 2"),
    ("spec.algorithm.name", "a3c", "spec.algorithm.name", "unknown algorithm"),
    ("spec.algorithm.name", "ppo", "spec.roles.critic", "critic"),
    ("spec.algorithm.advantageEstimator", "magic", "spec.algorithm.advantageEstimator", "unknown estimator"),
    ("spec.algorithm.klEstimator", "k9", "spec.algorithm.klEstimator", "k1, k2 or k3"),
    ("spec.algorithm.lossAggregation", "sum", "spec.algorithm.lossAggregation", "unknown aggregation"),
    (
        "spec.algorithm.policyLoss",
        "sgd",
        "spec.algorithm.policyLoss",
        "unknown policy loss 'sgd'; expected ppo_clip",
    ),
    ("spec.roles.rollout.backend", "tgi", "spec.roles.rollout.backend", "unknown backend 'tgi'"),
    ("spec.algorithm.clipHigh", 0.1, "spec.algorithm.clipHigh", ">= clipLow"),
    ("spec.algorithm.clipLow", 1.5, "spec.algorithm.clipLow", "< 1"),
    ("spec.algorithm.topK", 9, "spec.algorithm.topK", "samplesPerPrompt"),
    ("spec.algorithm.klCoef", 0.1, "spec.roles.reference", "reference"),
    ("spec.algorithm.klCoef", -0.1, "spec.algorithm.klCoef", ">= 0"),
    ("spec.data.rewardType", "vibes", "spec.data.rewardType", "unknown reward type"),
    ("spec.data.rewardType", "reward_model", "spec.data.rewardModel", "needs data.rewardModel"),
    ("spec.data.train", DELETE, "spec.data.train", "required"),
    ("spec.data.format", "csv", "spec.data.format", "jsonl"),
    ("spec.data.temperature", -1, "spec.data.temperature", ">= 0"),
    ("spec.data.topP", 0, "spec.data.topP", "> 0"),
    ("spec.data.maxNewTokens", 0, "spec.data.maxNewTokens", "> 0"),
    ("spec.training.batchSize", 0, "spec.training.batchSize", "> 0"),
    ("spec.training.minibatchSize", 16, "spec.training.minibatchSize", "<= training.batchSize"),
    ("spec.training.microbatchSize", 8, "spec.training.microbatchSize", "<= training.minibatchSize"),
    ("spec.training.minibatchSize", 3, "spec.training.minibatchSize", "must divide"),
    ("spec.training.batchSize", 3, "spec.roles.rollout.batchSize", "multiple of learner replicas"),
    ("spec.roles.learner.replicas", 3, "spec.roles.rollout.batchSize", "multiple of learner replicas"),
    ("spec.training.learningRate", 0, "spec.training.learningRate", "> 0"),
    ("spec.training.epochs", 2, "spec.training.epochs", "not both"),
    ("spec.training.checkpoint", {"every": 5}, "spec.training.checkpoint.dir", "required"),
    ("spec.training.maxStaleness", -1, "spec.training.maxStaleness", ">= 0"),
    ("spec.model", {}, "spec.model", "exactly one of path, package, tiny"),
    ("spec.model", {"path": "/m", "package": "p"}, "spec.model", "exactly one"),
    ("spec.model.dtype", "int8", "spec.model.dtype", "float32"),
    ("spec.model.tiny", {"hiddenSize": 30, "numHeads": 4}, "spec.model.tiny", "multiple of numHeads"),
    ("spec.model.lora", {"rank": 0}, "spec.model.lora.rank", "> 0"),
    ("spec.roles.rollout.backend", "tgi", "spec.roles.rollout.backend", "hf"),
    ("spec.roles.learner.backend", "vllm", "spec.roles.learner.backend", "only the rollout role"),
    ("spec.roles.rollout.resources", {"memory": "lots"}, "spec.roles.rollout.resources", "quantity"),
    ("spec.roles.rollout.resources", {"gpus": -1}, "spec.roles.rollout.resources.gpus", ">= 0"),
    ("spec.roles.rollout.resources", {"gpuMemory": "big"}, "spec.roles.rollout.resources", "quantity"),
    ("spec.roles.learner.sharding", "zero3", "spec.roles.learner.sharding", "'ddp' or 'fsdp'"),
    ("spec.roles.rollout.sharding", "fsdp", "spec.roles.rollout.sharding", "only training roles"),
    ("spec.roles.reward", {"sharding": "fsdp"}, "spec.roles.reward.sharding", "only training roles"),
    (
        "spec.roles.critic",
        {"replicas": 0, "sharding": "fsdp"},
        "spec.roles.critic.replicas",
        "a colocated critic runs inside learner rank 0",
    ),
    (
        "spec.roles.critic",
        {"replicas": 2, "sharding": "fsdp", "failurePolicy": "restartPod"},
        "spec.roles.critic.failurePolicy",
        "restart together",
    ),
    ("spec.roles.critic", {"cpuOffload": True}, "spec.roles.critic.cpuOffload", "needs sharding: fsdp"),
    (
        "spec.roles.rollout.activationCheckpointing",
        True,
        "spec.roles.rollout.activationCheckpointing",
        "only training roles",
    ),
    ("spec.roles.learner.cpuOffload", True, "spec.roles.learner.cpuOffload", "needs sharding: fsdp"),
    (
        "spec.roles.rollout.nodePools",
        [{"name": "a100", "replicas": 1}],
        "spec.roles.rollout.nodePools",
        "add up to 1",
    ),
    (
        "spec.roles.rollout.nodePools",
        [{"name": "a", "replicas": 1}, {"name": "a", "replicas": 1}],
        "spec.roles.rollout.nodePools[1].name",
        "duplicate",
    ),
    (
        "spec.roles.rollout.nodePools",
        [{"name": "A_100", "replicas": 2}],
        "spec.roles.rollout.nodePools[0].name",
        "must match",
    ),
    (
        "spec.roles.rollout.nodePools",
        [{"name": "a", "replicas": 2, "tolerations": [{"effect": "Sometimes"}]}],
        "spec.roles.rollout.nodePools[0].tolerations[0].effect",
        "NoSchedule",
    ),
    ("spec.volunteers", {"enabled": True}, "spec.volunteers.tokenSecretRef", "required"),
    ("spec.volunteers", {"verifyFraction": 1.5}, "spec.volunteers.verifyFraction", "<= 1"),
    ("spec.volunteers", {"dhtPort": 80}, "spec.volunteers.dhtPort", ">= 1024"),
    ("spec.suspend", "maybe", "spec.suspend", "boolean"),
    ("spec.algorithm.dynamicFilter", {"low": 0.9, "high": 0.1}, "spec.algorithm.dynamicFilter", "low"),
    (
        "spec.algorithm.overlong",
        {"enabled": True, "cacheLength": 500},
        "spec.algorithm.overlong.cacheLength",
        "maxNewTokens",
    ),
    ("spec.training.evalEvery", 5, "spec.data.eval", "required"),
    ("metadata.name", "Bad_Name", "metadata.name", "must match"),
    ("metadata.name", "x" * 41, "metadata.name", "at most 40"),
    ("spec.training", "fast", "spec.training", "valid dictionary"),
]


@pytest.mark.parametrize(
    ("path", "value", "field", "words"), INVALID, ids=[f"{c[0]}={c[1]!r}"[:60] for c in INVALID]
)
def test_invalid_manifest_names_the_field(path: str, value: object, field: str, words: str) -> None:
    doc = mutate(path, value)
    if field == "spec.data.eval":
        doc["spec"]["data"].pop("eval")
    problems = problems_of(doc)
    matching = [p for p in problems if p.startswith(field + ":")]
    assert matching, f"no problem names {field}: {problems}"
    assert any(words.lower() in p.lower() for p in matching), problems


LOSS_MISFITS = [
    # (algorithm fields over SMALL_JOB's, expected field path, expected words)
    (
        {"policyLoss": "gspo", "lossAggregation": "token_mean"},
        "spec.algorithm.lossAggregation",
        "seq_mean_token_mean",
    ),
    (
        {"policyLoss": "gspo", "lossAggregation": "seq_mean_token_sum"},
        "spec.algorithm.lossAggregation",
        "length",
    ),
    ({"policyLoss": "gspo", "dualClip": 3.0}, "spec.algorithm.dualClip", "'gspo' does not read it"),
    (
        {"policyLoss": "cispo", "skipThreshold": 2.0},
        "spec.algorithm.skipThreshold",
        "'cispo' does not read it",
    ),
    ({"policyLoss": "vanilla_pg", "clipLow": 0.2}, "spec.algorithm.clipLow", "reads none of them"),
    ({"policyLoss": "vanilla_pg", "clipHigh": 0.3}, "spec.algorithm.clipHigh", "does not read it"),
    ({"policyLoss": "gspo", "clipHigh": 1e-4}, "spec.algorithm.clipHigh", ">= clipLow (0.0003)"),
    ({"clipHigh": 0.1}, "spec.algorithm.clipHigh", ">= clipLow (0.2)"),
    (
        {"rolloutCorrection": {"rejectLow": 2.0, "rejectHigh": 1.5}},
        "spec.algorithm.rolloutCorrection.rejectLow",
        "must be <= rejectHigh (1.5)",
    ),
    (
        {"rolloutCorrection": {"rejectLow": 1.2, "rejectHigh": 3.0}},
        "spec.algorithm.rolloutCorrection.rejectLow",
        "must hold ratio 1",
    ),
    (
        {"rolloutCorrection": {"rejectHigh": 0.9}},
        "spec.algorithm.rolloutCorrection.rejectHigh",
        "must be >= 1",
    ),
    ({"rolloutCorrection": {"rejectLow": 0}}, "spec.algorithm.rolloutCorrection.rejectLow", "> 0"),
    ({"rolloutCorrection": {"cap": 0.5}}, "spec.algorithm.rolloutCorrection.cap", ">= 1"),
    (
        {"rolloutCorrection": {"importanceSampling": "tokens"}},
        "spec.algorithm.rolloutCorrection.importanceSampling",
        "'off', 'token' or 'sequence'",
    ),
    ({"rolloutCorrection": {"rejection": "icepop"}}, "spec.algorithm.rolloutCorrection.rejection", "'token'"),
    ({"whitenAdvantages": "maybe"}, "spec.algorithm.whitenAdvantages", "boolean"),
]


@pytest.mark.parametrize(
    ("fields", "field", "words"), LOSS_MISFITS, ids=[c[1] + str(i) for i, c in enumerate(LOSS_MISFITS)]
)
def test_loss_settings_that_do_not_fit_name_the_field(fields: dict, field: str, words: str) -> None:
    doc = copy.deepcopy(SMALL_JOB)
    doc["spec"]["algorithm"].update(fields)
    problems = problems_of(doc)
    matching = [p for p in problems if p.startswith(field + ":")]
    assert matching, f"no problem names {field}: {problems}"
    assert any(words.lower() in p.lower() for p in matching), problems


def resolved(**fields: object):
    doc = copy.deepcopy(SMALL_JOB)
    backend = fields.pop("backend", None)
    if backend:
        doc["spec"]["roles"]["rollout"]["backend"] = backend
    doc["spec"]["algorithm"].update(fields)
    return parse_job(doc).spec


def test_policy_loss_defaults_and_overrides() -> None:
    spec = resolved()
    assert (spec.policy_loss, spec.clip_range, spec.loss_aggregation) == (
        "ppo_clip",
        (0.2, 0.2),
        "token_mean",
    )
    spec = resolved(name="dapo")
    assert spec.clip_range == (0.2, 0.28)
    spec = resolved(policyLoss="gspo")  # the paper's sequence-level range and the mean over sequences
    assert (spec.clip_range, spec.loss_aggregation) == ((3e-4, 4e-4), "seq_mean_token_mean")
    spec = resolved(name="dapo", policyLoss="gspo", clipHigh=5e-4)
    assert spec.clip_range == (3e-4, 5e-4)
    spec = resolved(policyLoss="cispo")  # no lower bound unless asked
    assert spec.clip_range == (None, 0.2)
    assert resolved(policyLoss="cispo", clipLow=0.5).clip_range == (0.5, 0.2)
    assert resolved(policyLoss="vanilla_pg").loss_aggregation == "token_mean"
    assert resolved(lossAggregation="seq_mean_token_sum").loss_aggregation == "seq_mean_token_sum"


def test_whitening_is_on_for_ppo_only_unless_set() -> None:
    assert resolved().whiten_advantages is False
    assert resolved(whitenAdvantages=True).whiten_advantages is True
    doc = copy.deepcopy(SMALL_JOB)
    doc["spec"]["algorithm"] = {"name": "ppo", "samplesPerPrompt": 4}
    doc["spec"]["roles"]["critic"] = {"replicas": 1}
    assert parse_job(doc).spec.whiten_advantages is True
    doc["spec"]["algorithm"]["whitenAdvantages"] = False
    assert parse_job(doc).spec.whiten_advantages is False


def test_rollout_correction_is_on_by_default_with_vllm_only() -> None:
    assert resolved().rollout_correction is None  # hf: the rollout runs the learner's kernels
    vllm = resolved(backend="vllm").rollout_correction
    assert vllm is not None and (vllm.importance_sampling, vllm.cap, vllm.rejection) == ("token", 2.0, "off")
    assert resolved(backend="vllm", rolloutCorrection={"enabled": False}).rollout_correction is None
    chosen = resolved(
        rolloutCorrection={"importanceSampling": "sequence", "rejection": "token"}
    ).rollout_correction
    assert chosen is not None and (chosen.importance_sampling, chosen.rejection) == ("sequence", "token")


def test_dapo_shaping_defaults_come_from_the_preset_unless_set() -> None:
    """The preset's filters and shaping, resolved in the spec: DAPO's dynamic filter takes the section's
    default band and its overlong punishment a quarter of maxNewTokens when the spec names neither."""
    grpo = resolved()
    assert (grpo.dynamic_filter, grpo.overlong, grpo.mask_truncated, grpo.norm_adv_by_std) == (
        None,
        None,
        False,
        True,
    )
    dapo = resolved(name="dapo")
    quarter = max(1, dapo.data.max_new_tokens // 4)
    assert (dapo.dynamic_filter, dapo.overlong, dapo.mask_truncated) == ((0.01, 0.99), (quarter, 1.0), True)
    chosen = resolved(
        name="dapo",
        dynamicFilter={"enabled": True, "low": 0.1, "high": 0.9},
        overlong={"enabled": True, "cacheLength": 1, "penaltyFactor": 0.5},
        maskTruncated=False,
        normAdvByStd=False,
    )
    assert (chosen.dynamic_filter, chosen.overlong, chosen.mask_truncated, chosen.norm_adv_by_std) == (
        (0.1, 0.9),
        (1, 0.5),
        False,
        False,
    )
    off = resolved(name="dapo", dynamicFilter={"enabled": False}, overlong={"enabled": False})
    assert (off.dynamic_filter, off.overlong) == (None, None)
    assert resolved(overlong={"enabled": True}).overlong == (quarter, 1.0)


def test_several_problems_are_reported_together() -> None:
    doc = mutate("spec.training.minibatchSize", 16)
    doc["spec"]["algorithm"]["name"] = "ppo"
    doc["spec"]["data"]["rewardType"] = "vibes"
    problems = problems_of(doc)
    fields = {p.split(":")[0] for p in problems}
    assert {"spec.roles.critic", "spec.data.rewardType", "spec.training.minibatchSize"} <= fields


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ([1, 2], "(root)", "mapping"),
        ("just text", "(root)", "mapping"),
        (None, "(root)", "empty"),
        ({**SMALL_JOB, "kind": "Deployment"}, "kind", "not an RLHFJob"),
        ({**SMALL_JOB, "apiVersion": "dverl.io/v2"}, "apiVersion", "dverl.io/v1alpha1"),
        ({k: v for k, v in SMALL_JOB.items() if k != "spec"}, "spec", "required"),
    ],
)
def test_documents_that_are_not_rlhfjobs(doc: object, field: str, words: str) -> None:
    problems = problems_of(doc)
    assert any(p.startswith(field + ":") and words in p for p in problems), problems


def test_colocated_roles_and_unknown_pool_gpu_are_fine() -> None:
    doc = mutate("spec.roles.reference", {"replicas": 0})
    doc["spec"]["algorithm"]["klCoef"] = 0.01
    job = parse_job(doc)
    assert job.spec.roles.reference.replicas == 0


def test_yaml_round_trip_of_example(tmp_path: Path) -> None:
    job = load_job(EXAMPLE_JOBS[0])
    dumped = yaml.safe_dump(
        {
            "apiVersion": "dverl.io/v1alpha1",
            "kind": "RLHFJob",
            "metadata": {"name": job.metadata.name},
            "spec": with_defaults(job.spec),
        }
    )
    target = tmp_path / "job.yaml"
    target.write_text(dumped)
    assert load_job(target).spec == job.spec


def test_fsdp_learners_need_rollout_workers_and_refuse_lora() -> None:
    doc = mutate("spec.roles.learner.sharding", "fsdp")
    assert parse_job(doc).spec.roles.learner.sharding == "fsdp"
    doc["spec"]["roles"]["rollout"]["replicas"] = 0
    doc["spec"]["model"]["lora"] = {"rank": 4}
    found = problems_of(doc)
    assert any(p.startswith("spec.roles.rollout.replicas") and "fsdp" in p for p in found), found
    assert any(p.startswith("spec.roles.learner.sharding") and "lora" in p for p in found), found
