"""veRL's `ppo_trainer` config (`python -m verl.trainer.main_ppo` YAML and its Hydra `key=value`
overrides) as an RLHFJob manifest.

veRL puts actor, rollout and reference on the same GPUs and time-shares them (the hybrid engine);
a manifest gives rollout workers GPUs of their own, so the converted job asks for the learner's GPUs
plus the rollout's, and says so in its notes.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from decentralized_verl.convert.common import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    TRACKERS,
    Conversion,
    Rule,
    Unmapped,
    apply_rules,
    as_bool,
    as_float,
    as_int,
    flatten,
    get,
    job_name,
    lora_targets,
    manifest,
    per_learner,
    put,
)
from decentralized_verl.spec import safe_yaml
from decentralized_verl.spec.catalogue.backends import HF, VLLM

A = "actor_rollout_ref"

RULES: dict[str, Rule] = {
    "data.train_batch_size": ("training.batchSize", as_int),
    "data.max_prompt_length": ("data.maxPromptTokens", as_int),
    "data.max_response_length": ("data.maxNewTokens", as_int),
    f"{A}.model.path": ("model.path", str),
    f"{A}.model.enable_gradient_checkpointing": ("roles.learner.activationCheckpointing", as_bool),
    f"{A}.model.lora_alpha": ("model.lora.alpha", as_float),
    f"{A}.model.target_modules": ("model.lora.targetModules", lora_targets),
    f"{A}.actor.optim.lr": ("training.learningRate", as_float),
    f"{A}.actor.optim.weight_decay": ("training.weightDecay", as_float),
    f"{A}.actor.optim.lr_warmup_steps": ("training.warmupSteps", lambda v: max(0, as_int(v))),
    f"{A}.actor.ppo_mini_batch_size": ("training.minibatchSize", as_int),
    f"{A}.actor.ppo_epochs": ("algorithm.ppoEpochs", as_int),
    f"{A}.actor.grad_clip": ("training.maxGradNorm", as_float),
    f"{A}.actor.entropy_coeff": ("algorithm.entropyCoef", as_float),
    f"{A}.actor.clip_ratio_low": ("algorithm.clipLow", as_float),
    f"{A}.actor.clip_ratio_high": ("algorithm.clipHigh", as_float),
    f"{A}.actor.clip_ratio_c": ("algorithm.dualClip", as_float),
    f"{A}.actor.loss_agg_mode": ("algorithm.lossAggregation", lambda v: LOSS_AGGREGATIONS[v]),
    f"{A}.actor.kl_loss_type": ("algorithm.klEstimator", lambda v: KL_ESTIMATORS[v]),
    f"{A}.actor.fsdp_config.param_offload": ("roles.learner.cpuOffload", as_bool),
    f"{A}.rollout.n": ("algorithm.samplesPerPrompt", as_int),
    f"{A}.rollout.name": ("roles.rollout.backend", lambda v: {"vllm": VLLM.name, "hf": HF.name}[v]),
    f"{A}.rollout.temperature": ("data.temperature", as_float),
    f"{A}.rollout.top_p": ("data.topP", as_float),
    f"{A}.rollout.top_k": ("data.topK", lambda v: max(0, as_int(v))),
    "algorithm.gamma": ("algorithm.gamma", as_float),
    "algorithm.lam": ("algorithm.lam", as_float),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.normAdvByStd", as_bool),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.klCoef", as_float),
    "critic.optim.lr": ("training.criticLearningRate", as_float),
    "critic.cliprange_value": ("algorithm.valueClip", as_float),
    "trainer.total_epochs": ("training.epochs", as_int),
    "trainer.total_training_steps": ("training.steps", as_int),
    "trainer.save_freq": ("training.checkpoint.every", lambda v: max(0, as_int(v))),
    "trainer.test_freq": ("training.evalEvery", lambda v: max(0, as_int(v))),
    "trainer.project_name": ("training.tracking.project", str),
    "trainer.default_local_dir": ("training.checkpoint.dir", str),
    "trainer.seed": ("training.seed", as_int),
    "data.seed": ("training.seed", as_int),
}
"""Fields that map one to one (with a value conversion)."""

HANDLED = {
    "algorithm.adv_estimator": "the algorithm preset",
    "algorithm.use_kl_in_reward": "where the KL goes (algorithm.klIn)",
    f"{A}.actor.use_kl_loss": "where the KL goes (algorithm.klIn)",
    f"{A}.actor.kl_loss_coef": "algorithm.klCoef",
    f"{A}.actor.clip_ratio": "algorithm.clipLow and clipHigh",
    f"{A}.actor.ppo_micro_batch_size_per_gpu": "training.microbatchSize (prompts: samples / rollout.n)",
    f"{A}.model.lora_rank": "model.lora.rank (0: no LoRA)",
    f"{A}.rollout.tensor_model_parallel_size": "roles.rollout.resources.gpus",
    "data.train_files": "data.train",
    "data.val_files": "data.eval",
    "trainer.n_gpus_per_node": "roles (learner and rollout GPUs)",
    "trainer.nnodes": "roles (learner and rollout GPUs)",
    "trainer.logger": "training.logging",
    "trainer.experiment_name": "metadata.name and training.tracking.runName",
    "custom_reward_function.path": "data.rewardType (module:function)",
    "custom_reward_function.name": "data.rewardType (module:function)",
}
"""Fields read by the converter's own code below (several fields make one setting)."""

DROPPED = {
    "data.filter_overlong_prompts": "prompts over data.maxPromptTokens are always dropped, with a warning",
    "data.truncation": "dverl never truncates a prompt; one longer than maxPromptTokens is dropped",
    "data.val_batch_size": "evaluation batches are sized by the rollout workers",
    "data.prompt_key": "dverl reads veRL parquet's `prompt` column itself (data.format)",
    "data.reward_fn_key": "the reward comes from data.rewardType",
    "data.return_raw_chat": "prompts are rendered with the model's chat template",
    "data.shuffle": "dverl's sampler always shuffles, seeded by training.seed",
    f"{A}.model.use_remove_padding": "dverl packs micro-batches itself (training.microbatchTokens)",
    f"{A}.model.use_shm": "no dverl equivalent (models load from model.path)",
    f"{A}.actor.fsdp_config.optimizer_offload": "cpuOffload moves parameters, gradients, optimizer",
    f"{A}.actor.strategy": "the learner's sharding is roles.learner.sharding (set from the GPU count)",
    f"{A}.actor.use_dynamic_bsz": "use training.microbatchTokens for token-budget micro-batches",
    f"{A}.actor.ppo_max_token_len_per_gpu": "use training.microbatchTokens for token-budget micro-batches",
    f"{A}.actor.ulysses_sequence_parallel_size": "dverl has no sequence parallelism",
    f"{A}.rollout.gpu_memory_utilization": "dverl plan sizes vLLM's memory share itself",
    f"{A}.rollout.log_prob_micro_batch_size_per_gpu": "the log-prob pass uses the learner's micro-batch",
    f"{A}.rollout.enable_chunked_prefill": "vLLM's default is kept",
    f"{A}.rollout.enforce_eager": "vLLM's default is kept",
    f"{A}.rollout.free_cache_engine": "rollout workers keep their own GPUs (no sleep/wake between phases)",
    f"{A}.rollout.mode": "dverl's rollout workers are always asynchronous servers",
    f"{A}.ref.log_prob_micro_batch_size_per_gpu": "the reference worker sizes its own batches",
    f"{A}.ref.fsdp_config.param_offload": "a reference worker holds its model on its own GPU",
    f"{A}.hybrid_engine": "rollout workers have GPUs of their own (no hybrid engine)",
    "trainer.critic_warmup": "the critic trains from the first step",
    "trainer.val_before_train": "dverl always evaluates before training when data.eval is set",
    "trainer.log_val_generations": "samples are logged every training.tracking.samplesEvery steps",
    "trainer.resume_mode": "use `dverl run --resume` or the operator's automatic resume",
    "trainer.device": "the device follows roles.*.resources.gpus",
}

ESTIMATORS = {
    "grpo": "grpo",
    "gae": "ppo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
}


def parse_overrides(overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Hydra's `key=value`, `+key=value`, `++key=value` (set) and `~key` (remove), values as YAML."""
    sets: dict[str, Any] = {}
    removes: list[str] = []
    for item in overrides:
        item = item.strip()
        if not item:
            continue
        if item.startswith("~"):
            removes.append(item[1:].split("=", 1)[0])
            continue
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected key=value")
        key, raw = item.lstrip("+").split("=", 1)
        value = safe_yaml.load(raw) if raw.strip() else None
        sets[key.strip()] = value
    return sets, removes


def command_overrides(text: str) -> list[str] | None:
    """The `key=value` words of a `python -m verl.trainer.main_ppo ...` command line (a run script), or
    None when `text` is not one."""
    if "verl.trainer.main_ppo" not in text:
        return None
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    start = next(i for i, w in enumerate(words) if "verl.trainer.main_ppo" in w)
    return [w for w in words[start + 1 :] if "=" in w and not w.startswith("-")]


def _load(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    loaded = safe_yaml.load(text)
    if not isinstance(loaded, dict):
        raise ValueError("a veRL config is a YAML mapping (or a main_ppo command line)")
    return loaded


def convert_verl(text: str, overrides: list[str], name: str | None = None) -> Conversion:
    from_command = command_overrides(text)
    if from_command is not None:
        text, overrides = "", [*from_command, *overrides]
    flat = flatten(_load(text))
    for key in ("defaults", "hydra"):  # Hydra's own composition keys
        flat = {k: v for k, v in flat.items() if k != key and not k.startswith(key + ".")}
    sets, removes = parse_overrides(overrides)
    flat.update(sets)
    for key in removes:
        flat = {k: v for k, v in flat.items() if k != key and not k.startswith(key + ".")}
    flat = {k: v for k, v in flat.items() if v is not None}
    spec: dict[str, Any] = {}
    result = Conversion(manifest={})
    interpolated = {k: v for k, v in flat.items() if isinstance(v, str) and "${" in v}
    for key, value in interpolated.items():
        result.unmapped.append(Unmapped(key, value, "a Hydra interpolation; give the value itself"))
    flat = {k: v for k, v in flat.items() if k not in interpolated}

    _algorithm(flat, spec, result)
    _data(flat, spec, result)
    _roles(flat, spec, result)
    _tracking(flat, spec, result)
    lora_rank = as_int(flat.get(f"{A}.model.lora_rank", 0))
    simple = {k: v for k, v in flat.items() if k not in HANDLED}
    if not lora_rank:
        for key in (f"{A}.model.lora_alpha", f"{A}.model.target_modules"):
            if key in simple:
                result.unmapped.append(Unmapped(key, simple.pop(key), "LoRA is off (lora_rank 0)"))

    apply_rules(simple, RULES, DROPPED, spec, result)
    if lora_rank:
        put(spec, "model.lora.rank", lora_rank)
    if "steps" in spec.get("training", {}) and "epochs" in spec["training"]:
        result.notes.append("training.steps and training.epochs both given; dverl takes steps")
        del spec["training"]["epochs"]
    _micro_batch(flat, spec, result)
    per_learner(spec, result)
    experiment = flat.get("trainer.experiment_name")
    if as_int(get(spec, "training.checkpoint.every", 0)) > 0 and get(spec, "training.checkpoint.dir") is None:
        project = flat.get("trainer.project_name", "verl_examples")
        folder = f"checkpoints/{project}/{experiment or 'run'}"
        put(spec, "training.checkpoint.dir", folder)
        result.notes.append(f"training.checkpoint.dir is veRL's default_local_dir, {folder}")
    result.manifest = manifest(job_name(name or experiment, "verl-job"), spec)
    return result


def _algorithm(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    estimator = flat.get("algorithm.adv_estimator", "gae")
    if estimator not in ESTIMATORS:
        result.unmapped.append(
            Unmapped("algorithm.adv_estimator", estimator, f"dverl has {', '.join(ESTIMATORS)}; using grpo")
        )
        estimator = "grpo"
    elif "algorithm.adv_estimator" not in flat:
        result.notes.append("algorithm.adv_estimator not given: veRL's default gae (ppo with a critic)")
    put(spec, "algorithm.name", ESTIMATORS[estimator])
    if estimator == "gae":
        put(spec, "roles.critic", {"replicas": 1, "resources": {"gpus": 1}})
    in_loss = as_bool(flat.get(f"{A}.actor.use_kl_loss", False))
    in_reward = as_bool(flat.get("algorithm.use_kl_in_reward", False))
    if in_loss:
        put(spec, "algorithm.klIn", "loss")
        put(spec, "algorithm.klCoef", as_float(flat.get(f"{A}.actor.kl_loss_coef", 0.001)))
        if not in_reward:
            flat.pop("algorithm.kl_ctrl.kl_coef", None)
    elif in_reward:
        put(spec, "algorithm.klIn", "reward")
    else:
        flat.pop("algorithm.kl_ctrl.kl_coef", None)
        if f"{A}.actor.kl_loss_coef" in flat:
            result.notes.append("actor.kl_loss_coef is ignored: use_kl_loss is false")
    if in_loss or in_reward:
        put(spec, "roles.reference", {"replicas": 1, "resources": {"gpus": 1}})
    if f"{A}.actor.clip_ratio" in flat:
        ratio = as_float(flat[f"{A}.actor.clip_ratio"])
        put(spec, "algorithm.clipLow", ratio)
        put(spec, "algorithm.clipHigh", ratio)


def _data(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    for key, target in (("data.train_files", "data.train"), ("data.val_files", "data.eval")):
        files = flat.get(key)
        if files is None:
            continue
        files = [files] if isinstance(files, str) else list(files)
        put(spec, target, str(files[0]))
        for extra in files[1:]:
            result.unmapped.append(Unmapped(key, extra, f"{target} takes one file; concatenate them"))
    if get(spec, "data.train") is None:
        put(spec, "data.train", "train.parquet")
        result.notes.append("data.train_files not given: data.train is train.parquet; set it")
    path, function = flat.get("custom_reward_function.path"), flat.get("custom_reward_function.name")
    if path:
        module = str(path).rsplit("/", 1)[-1].removesuffix(".py")
        put(spec, "data.rewardType", f"{module}:{function or 'compute_score'}")
        result.notes.append(
            f"data.rewardType imports {module} from the manifest's folder: copy {path} next to it"
        )
    else:
        put(spec, "data.rewardType", "boxed")
        result.notes.append(
            "veRL picks the reward by data_source (gsm8k, math, ...); data.rewardType is boxed "
            "(\\boxed{} answers against reward_model.ground_truth); use module:function for another"
        )


def _roles(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    gpus = as_int(flat.get("trainer.n_gpus_per_node", 1)) * as_int(flat.get("trainer.nnodes", 1))
    tp = as_int(flat.get(f"{A}.rollout.tensor_model_parallel_size", 1))
    learner = {"replicas": gpus, "resources": {"gpus": 1}}
    if gpus > 1:
        learner["sharding"] = "fsdp"
    put(spec, "roles.learner", {**get(spec, "roles.learner", {}), **learner})
    rollout = {"replicas": max(1, gpus // tp), "resources": {"gpus": tp}}
    put(spec, "roles.rollout", {**get(spec, "roles.rollout", {}), **rollout})
    if get(spec, "roles.rollout.backend") is None:
        put(spec, "roles.rollout.backend", VLLM.name)
    put(spec, "model.dtype", "bfloat16")
    result.notes.append(
        f"veRL time-shares {gpus} GPU(s) between actor and rollout; here {gpus} learner GPU(s) and "
        f"{rollout['replicas']} rollout worker(s) of {tp} GPU(s) each are separate; lower either to fit"
    )


def _tracking(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    loggers = flat.get("trainer.logger")
    if loggers is not None:
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        kept = [t for t in loggers if t in TRACKERS]
        for other in (t for t in loggers if t not in TRACKERS):
            why = "progress lines are always printed" if other == "console" else "not a dverl tracker"
            result.unmapped.append(Unmapped("trainer.logger", other, why))
        if kept:
            put(spec, "training.logging", kept)
    if flat.get("trainer.experiment_name"):
        put(spec, "training.tracking.runName", str(flat["trainer.experiment_name"]))


def _micro_batch(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    micro = flat.get(f"{A}.actor.ppo_micro_batch_size_per_gpu")
    if micro is None:
        return
    n = as_int(get(spec, "algorithm.samplesPerPrompt", 8))
    prompts = max(1, math.floor(as_int(micro) / n))
    put(spec, "training.microbatchSize", prompts)
    if as_int(micro) % n:
        result.notes.append(
            f"actor.ppo_micro_batch_size_per_gpu {micro} samples is {as_int(micro) / n:g} prompts of "
            f"{n} samples; training.microbatchSize is {prompts}"
        )
