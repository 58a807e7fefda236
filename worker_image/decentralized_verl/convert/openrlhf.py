"""An OpenRLHF command line (`python -m openrlhf.cli.train_ppo_ray --pretrain ... --flag value ...`, as in
its example scripts) as an RLHFJob manifest."""

from __future__ import annotations

import shlex
from typing import Any

from decentralized_verl.convert.common import (
    KL_ESTIMATORS,
    TRACKERS,
    Conversion,
    Rule,
    Unmapped,
    apply_rules,
    as_bool,
    as_float,
    as_int,
    get,
    job_name,
    lora_targets,
    manifest,
    per_learner,
    put,
)
from decentralized_verl.spec.catalogue.backends import VLLM

RULES: dict[str, Rule] = {
    "pretrain": ("model.path", str),
    "prompt_data": ("data.train", str),
    "eval_dataset": ("data.eval", str),
    "rollout_batch_size": ("training.batchSize", as_int),
    "n_samples_per_prompt": ("algorithm.samplesPerPrompt", as_int),
    "prompt_max_len": ("data.maxPromptTokens", as_int),
    "generate_max_len": ("data.maxNewTokens", as_int),
    "actor_learning_rate": ("training.learningRate", as_float),
    "critic_learning_rate": ("training.criticLearningRate", as_float),
    "init_kl_coef": ("algorithm.klCoef", as_float),
    "kl_estimator": ("algorithm.klEstimator", lambda v: KL_ESTIMATORS[v]),
    "eps_clip": ("algorithm.clipLow", as_float),
    "eps_clip_low_high": ("algorithm.clipHigh", lambda v: as_float(str(v).split()[-1])),
    "value_clip": ("algorithm.valueClip", as_float),
    "gamma": ("algorithm.gamma", as_float),
    "lambd": ("algorithm.lam", as_float),
    "entropy_loss_coef": ("algorithm.entropyCoef", as_float),
    "max_epochs": ("algorithm.ppoEpochs", as_int),
    "num_episodes": ("training.epochs", as_int),
    "max_norm": ("training.maxGradNorm", as_float),
    "l2": ("training.weightDecay", as_float),
    "seed": ("training.seed", as_int),
    "save_steps": ("training.checkpoint.every", lambda v: max(0, as_int(v))),
    "ckpt_path": ("training.checkpoint.dir", str),
    "eval_steps": ("training.evalEvery", lambda v: max(0, as_int(v))),
    "temperature": ("data.temperature", as_float),
    "top_p": ("data.topP", as_float),
    "gradient_checkpointing": ("roles.learner.activationCheckpointing", as_bool),
    "lora_rank": ("model.lora.rank", as_int),
    "lora_alpha": ("model.lora.alpha", as_float),
    "target_modules": ("model.lora.targetModules", lora_targets),
    "wandb_project": ("training.tracking.project", str),
    "wandb_run_name": ("training.tracking.runName", str),
    "remote_rm_url": ("data.rewardType", str),
}

HANDLED = {
    "advantage_estimator": "algorithm.name",
    "use_kl_loss": "algorithm.klIn",
    "reward_pretrain": "roles.reward (a reward model)",
    "actor_num_nodes": "roles.learner",
    "actor_num_gpus_per_node": "roles.learner",
    "vllm_num_engines": "roles.rollout",
    "vllm_tensor_parallel_size": "roles.rollout.resources.gpus",
    "critic_num_nodes": "roles.critic",
    "critic_num_gpus_per_node": "roles.critic",
    "ref_num_nodes": "roles.reference",
    "ref_num_gpus_per_node": "roles.reference",
    "use_wandb": "training.logging",
    "use_tensorboard": "training.logging",
    "bf16": "model.dtype",
    "micro_train_batch_size": "training.microbatchSize",
    "train_batch_size": "training.minibatchSize",
}

DROPPED = {
    "micro_rollout_batch_size": "rollout batches are roles.rollout.batchSize",
    "input_key": "dverl reads prompt/messages columns itself (data formats)",
    "label_key": "dverl reads answer/ground_truth columns itself",
    "apply_chat_template": "prompts are always rendered with the model's chat template",
    "zero_stage": "sharding is roles.learner.sharding (fsdp over several learners)",
    "adam_offload": "roles.learner.cpuOffload offloads parameters, gradients and optimizer together",
    "flash_attn": "dverl uses the model's default attention",
    "packing_samples": "use training.microbatchTokens to pack micro-batches",
    "colocate_all_models": "each role has GPUs of its own",
    "colocate_actor_ref": "each role has GPUs of its own",
    "colocate_critic_reward": "each role has GPUs of its own",
    "vllm_gpu_memory_utilization": "dverl plan sizes vLLM's memory share itself",
    "vllm_sync_backend": "weights travel over gRPC to rollout workers",
    "vllm_enable_sleep": "rollout workers keep their own GPUs",
    "deepspeed_enable_sleep": "learners keep their own GPUs",
    "enforce_eager": "vLLM's default is kept",
    "normalize_reward": "dverl has no running reward normalization",
    "max_samples": "cut the data file instead",
    "save_path": "the run folder is `dverl run --output` (or the operator's)",
    "save_hf_ckpt": "export a checkpoint with `dverl export`",
    "load_checkpoint": "use `dverl run --resume` or the operator's automatic resume",
    "logging_steps": "metrics are written every step",
    "wandb_org": "set WANDB_ENTITY in the workers' environment",
    "wandb_group": "no dverl equivalent",
}

ESTIMATORS = {
    "gae": "ppo",
    "group_norm": "grpo",
    "rloo": "rloo",
    "reinforce": "reinforce_plus_plus",
    "reinforce_baseline": "reinforce_plus_plus_baseline",
}


def parse_command(text: str) -> dict[str, Any]:
    """`--key value` and bare `--flag` (true) options of a command line; the program and its module are
    skipped, backslash-newlines joined."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    options: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            i += 1
            continue
        key = word[2:].replace("-", "_")
        if "=" in key:
            key, value = key.split("=", 1)
            options[key] = value
            i += 1
            continue
        values = []
        while i + 1 < len(words) and not words[i + 1].startswith("--"):
            values.append(words[i + 1])
            i += 1
        options[key] = True if not values else (values[0] if len(values) == 1 else " ".join(values))
        i += 1
    return options


def convert_openrlhf(text: str, name: str | None = None) -> Conversion:
    options = parse_command(text)
    spec: dict[str, Any] = {}
    result = Conversion(manifest={})
    estimator = str(options.get("advantage_estimator", "gae"))
    put(spec, "algorithm.name", ESTIMATORS.get(estimator, "grpo"))
    if estimator not in ESTIMATORS:
        result.unmapped.append(
            Unmapped("advantage_estimator", estimator, f"dverl maps {', '.join(ESTIMATORS)}")
        )
    samples = as_int(options.get("n_samples_per_prompt", 1))
    if samples < 2 and estimator != "gae":
        result.notes.append(
            f"n_samples_per_prompt {samples}: {estimator} needs groups; samplesPerPrompt is 8"
        )
        options["n_samples_per_prompt"] = 8
    _roles(options, spec, estimator)
    if options.get("use_kl_loss"):
        put(spec, "algorithm.klIn", "loss")
    elif "init_kl_coef" in options:
        put(spec, "algorithm.klIn", "reward")
    if "reward_pretrain" in options and "remote_rm_url" not in options:
        put(spec, "data.rewardType", "reward_model")
        put(spec, "data.rewardModel", {"path": str(options["reward_pretrain"])})
        put(spec, "roles.reward", {"replicas": 1, "resources": {"gpus": 1}})
    loggers = [
        t for t, flag in (("wandb", "use_wandb"), ("tensorboard", "use_tensorboard")) if options.get(flag)
    ]
    if loggers:
        put(spec, "training.logging", [t for t in loggers if t in TRACKERS])
    if as_bool(options.get("bf16", False)):
        put(spec, "model.dtype", "bfloat16")
    _batches(options, spec, result)
    simple = {k: v for k, v in options.items() if k not in HANDLED}
    if "remote_rm_url" in simple:
        result.unmapped.append(
            Unmapped("remote_rm_url", simple.pop("remote_rm_url"), "a reward server; write a module:function")
        )
        put(spec, "data.rewardType", "boxed")
    apply_rules(simple, RULES, DROPPED, spec, result)
    per_learner(spec, result)
    if get(spec, "data.train") is None:
        put(spec, "data.train", "train.jsonl")
        result.notes.append("--prompt_data not given: data.train is train.jsonl; set it")
    if get(spec, "data.rewardType") is None:
        put(spec, "data.rewardType", "boxed")
        result.notes.append("no reward model or server given: data.rewardType is boxed")
    if as_float(get(spec, "algorithm.klCoef", 0)) > 0 and get(spec, "roles.reference") is None:
        put(spec, "roles.reference", {"replicas": 1, "resources": {"gpus": 1}})
    result.manifest = manifest(job_name(name or options.get("wandb_run_name"), "openrlhf-job"), spec)
    return result


def _roles(options: dict[str, Any], spec: dict[str, Any], estimator: str) -> None:
    learners = as_int(options.get("actor_num_nodes", 1)) * as_int(options.get("actor_num_gpus_per_node", 1))
    learner: dict[str, Any] = {"replicas": learners, "resources": {"gpus": 1}}
    if learners > 1:
        learner["sharding"] = "fsdp"
    put(spec, "roles.learner", learner)
    engines = as_int(options.get("vllm_num_engines", 1))
    tp = as_int(options.get("vllm_tensor_parallel_size", 1))
    put(spec, "roles.rollout", {"replicas": engines, "backend": VLLM.name, "resources": {"gpus": tp}})
    if estimator == "gae":
        critics = as_int(options.get("critic_num_nodes", 1)) * as_int(
            options.get("critic_num_gpus_per_node", 1)
        )
        put(spec, "roles.critic", {"replicas": max(1, critics), "resources": {"gpus": 1}})


def _batches(options: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    samples = as_int(options.get("n_samples_per_prompt", 1))
    if "train_batch_size" in options:  # OpenRLHF counts samples; a manifest counts prompts
        put(spec, "training.minibatchSize", max(1, as_int(options["train_batch_size"]) // samples))
    if "micro_train_batch_size" in options:  # already per GPU
        put(spec, "training.microbatchSize", max(1, as_int(options["micro_train_batch_size"]) // samples))
    if "rollout_batch_size" not in options:
        result.notes.append("--rollout_batch_size not given: training.batchSize is the default 8")
