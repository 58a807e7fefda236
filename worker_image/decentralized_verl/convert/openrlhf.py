"""An OpenRLHF command line (`python -m openrlhf.cli.train_ppo_ray --flag value ...`, as in its example
scripts, variables and bash arrays included) as an RLHFJob manifest.

OpenRLHF renamed every flag in 2026-04 (v0.10.2, "dotted config hierarchy"): `--actor_learning_rate`
became `--actor.adam.lr`, `--param_dtype` `--ds.param_dtype`, and so on. The tables here are keyed by the
current dotted names; `LEGACY` maps the underscore names of v0.10.1 and earlier (and the few older ones
this converter always read) onto them, so a script of either era converts, and every message names the
flag as the script wrote it.
"""

from __future__ import annotations

import shlex
from typing import Any

from decentralized_verl.convert.common import (
    KL_ESTIMATORS,
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
from decentralized_verl.convert.shell import (
    command_flags,
    cut_note,
    logical_lines,
    script_command,
    unresolved_names,
)
from decentralized_verl.spec.catalogue.backends import VLLM

RULES: dict[str, Rule] = {
    "actor.model_name_or_path": ("model.path", str),
    "data.prompt_dataset": ("data.train", str),
    "eval.dataset": ("data.eval", str),
    "rollout.batch_size": ("training.batchSize", as_int),
    "rollout.n_samples_per_prompt": ("algorithm.samplesPerPrompt", as_int),
    "rollout.temperature": ("data.temperature", as_float),
    "rollout.top_p": ("data.topP", as_float),
    "prompt_max_len": ("data.maxPromptTokens", as_int),
    "actor.adam.lr": ("training.learningRate", as_float),
    "actor.adam.weight_decay": ("training.weightDecay", as_float),
    "actor.max_norm": ("training.maxGradNorm", as_float),
    "critic.adam.lr": ("training.criticLearningRate", as_float),
    "critic.value_clip": ("algorithm.valueClip", as_float),
    "algo.kl.init_coef": ("algorithm.klCoef", as_float),
    "algo.kl.estimator": ("algorithm.klEstimator", lambda v: KL_ESTIMATORS[v]),
    "algo.advantage.gamma": ("algorithm.gamma", as_float),
    "algo.advantage.lambd": ("algorithm.lam", as_float),
    "algo.advantage.no_std_norm": ("algorithm.normAdvByStd", lambda v: not as_bool(v)),
    "actor.eps_clip": ("algorithm.clipLow", as_float),
    "actor.dual_clip": ("algorithm.dualClip", as_float),
    "actor.entropy_coef": ("algorithm.entropyCoef", as_float),
    "actor.policy_loss_type": ("algorithm.policyLoss", lambda v: {"ppo": "ppo_clip", "gspo": "gspo"}[v]),
    "train.max_epochs": ("algorithm.ppoEpochs", as_int),
    "train.num_episodes": ("training.epochs", as_int),
    "train.seed": ("training.seed", as_int),
    "ckpt.save_steps": ("training.checkpoint.every", lambda v: max(0, as_int(v))),
    "ckpt.path": ("training.checkpoint.dir", str),
    "ckpt.max_num": ("training.checkpoint.keep", as_int),
    "eval.steps": ("training.evalEvery", lambda v: max(0, as_int(v))),
    "actor.gradient_checkpointing_enable": ("roles.learner.activationCheckpointing", as_bool),
    "ds.lora.rank": ("model.lora.rank", as_int),
    "ds.lora.alpha": ("model.lora.alpha", as_float),
    "ds.lora.target_modules": ("model.lora.targetModules", lora_targets),
    "logger.wandb.project": ("training.tracking.project", str),
    "logger.wandb.run_name": ("training.tracking.runName", str),
}
"""Flags that map one to one (with a value conversion)."""

HANDLED = {
    "algo.advantage.estimator": "algorithm.name",
    "algo.kl.use_loss": "algorithm.klIn",
    "actor.eps_clip_low_high": "algorithm.clipLow and clipHigh",
    "reward.model_name_or_path": "roles.reward (a reward model)",
    "reward.remote_url": "data.rewardType",
    "actor.num_nodes": "roles.learner",
    "actor.num_gpus_per_node": "roles.learner",
    "vllm.num_engines": "roles.rollout",
    "vllm.tensor_parallel_size": "roles.rollout.resources.gpus",
    "critic.num_nodes": "roles.critic",
    "critic.num_gpus_per_node": "roles.critic",
    "reward.num_nodes": "roles.reward",
    "reward.num_gpus_per_node": "roles.reward",
    "ref.num_nodes": "roles.reference",
    "ref.num_gpus_per_node": "roles.reference",
    "logger.wandb.key": "training.logging",
    "logger.tensorboard_dir": "training.logging",
    "ds.param_dtype": "model.dtype",
    "bf16": "model.dtype",
    "data.max_len": "data.maxPromptTokens and maxNewTokens (prompt + response)",
    "rollout.max_new_tokens": "data.maxNewTokens",
    "train.micro_batch_size": "training.microbatchSize (prompts: samples / n_samples_per_prompt)",
    "train.batch_size": "training.minibatchSize (prompts: samples / n_samples_per_prompt)",
    "train.dynamic_batch_enable": "training.microbatchTokens",
    "train.max_tokens_per_gpu": "training.microbatchTokens (with --train.dynamic_batch_enable)",
    "algo.advantage.is_correction_enable": "algorithm.rolloutCorrection",
    "algo.advantage.is_correction_type": "algorithm.rolloutCorrection (tis, icepop, seq-mask-tis)",
    "algo.advantage.is_correction_threshold": "algorithm.rolloutCorrection (cap or reject band)",
    "train.async_enable": "training.maxStaleness (the queue's size)",
    "train.async_queue_size": "training.maxStaleness (with --train.async_enable)",
    "algo.dynamic_filtering_enable": "algorithm.dynamicFilter",
    "algo.dynamic_filtering_range": "algorithm.dynamicFilter.low and high",
    "reward.overlong_buffer_len": "algorithm.overlong.cacheLength",
    "reward.overlong_penalty_factor": "algorithm.overlong.penaltyFactor",
}
"""Flags read by the converter's own code below (several flags make one setting)."""

DROPPED = {
    "rollout.micro_batch_size": "rollout batches are roles.rollout.batchSize",
    "rollout.vllm_generate_batch_size": "rollout batches are roles.rollout.batchSize",
    "rollout.max_tokens_per_gpu": "rollout workers size their own forward passes",
    "data.input_key": "dverl reads prompt/messages columns itself (data formats)",
    "data.label_key": "dverl reads answer/ground_truth columns itself",
    "data.apply_chat_template": "prompts are always rendered with the model's chat template",
    "data.input_template": "prompts are rendered with the model's chat template (data.systemPrompt, fewShot)",
    "data.max_samples": "cut the data file instead",
    "data.prompt_probs": "dverl trains on one file (data.train)",
    "data.prompt_split": "data.train is a file; save the split you want",
    "data.disable_fast_tokenizer": "the model's tokenizer is used as it loads",
    "data.dataloader_num_workers": "the learner reads the data file itself",
    "ds.zero_stage": "sharding is roles.learner.sharding (fsdp over several learners)",
    "ds.adam_offload": "roles.learner.cpuOffload offloads parameters, gradients and optimizer together",
    "ds.attn_implementation": "dverl uses the model's default attention",
    "ds.packing_samples": "use training.microbatchTokens to pack micro-batches",
    "ds.enable_sleep": "learners keep their own GPUs",
    "ds.ring_attn_size": "dverl has no sequence parallelism",
    "ds.ring_attn_head_stride": "dverl has no sequence parallelism",
    "ds.tensor_parallel_size": "the learner shards with FSDP, not tensor parallelism",
    "ds.load_in_4bit": "use model.quantization for QLoRA",
    "ds.lora.dropout": "dverl's LoRA adapters have no dropout",
    "train.colocate_all": "each role has GPUs of its own",
    "train.colocate_actor_ref": "each role has GPUs of its own",
    "train.colocate_critic_reward": "each role has GPUs of its own",
    "train.agent_func_path": "multi-turn episodes are data.environment (see README, Multi-turn and tools)",
    "vllm.gpu_memory_utilization": "dverl plan sizes vLLM's memory share itself",
    "vllm.sync_backend": "weights travel over gRPC to rollout workers",
    "vllm.enable_sleep": "rollout workers keep their own GPUs",
    "vllm.enforce_eager": "vLLM's default is kept",
    "reward.normalize_enable": "dverl has no running reward normalization",
    "ckpt.output_dir": "the run folder is `dverl run --output` (or the operator's)",
    "ckpt.save_hf": "export a checkpoint with `dverl export`",
    "ckpt.load_enable": "use `dverl run --resume` or the operator's automatic resume",
    "logger.logging_steps": "metrics are written every step",
    "logger.wandb.org": "set WANDB_ENTITY in the workers' environment",
    "logger.wandb.group": "no dverl equivalent",
    "actor.lr_scheduler": "dverl's schedule is linear warmup then constant",
    "actor.lr_warmup_ratio": "give warmup as training.warmupSteps",
    "actor_init_on_gpu": "removed from OpenRLHF in v0.10.2; models load onto their role's device",
    "perf": "removed from OpenRLHF in v0.10.2",
    "ptx_coef": "removed from OpenRLHF; dverl has no pretraining loss",
    "train.partial_rollout_enable": "no switch in dverl: a cut-off rollout worker's unfinished responses are "
    "continued by another",
    "data.image_key": "dverl trains text models",
    "eval.temperature": "dverl evaluates with one greedy answer per prompt",
    "eval.n_samples_per_prompt": "dverl evaluates with one greedy answer per prompt",
    "reward.stop_properly_penalty_coef": "no penalty for cut-off responses (algorithm.maskTruncated leaves "
    "them out of the loss)",
    "data.max_images_per_prompt": "dverl trains text models",
    "actor.freeze_visual_encoder": "dverl trains text models",
}

OTHER_FLAGS = (
    "local_rank",
    "use_ms",
    "ref.offload",
    "reward.offload",
    "reward.clip_range",
    "actor.aux_loss_coef",
    "actor.gradient_checkpointing_reentrant",
    "algo.kl.target",
    "algo.kl.horizon",
    "ckpt.best_metric_key",
    "ckpt.disable_ds",
    "ckpt.max_mem",
    "critic.freezing_steps",
    "critic.model_name_or_path",
    "critic.save_value_network",
    "ds.deepcompile",
    "ds.experts_implementation",
    "ds.grad_accum_dtype",
    "ds.overlap_comm",
    "ds.use_liger_kernel",
    "ds.use_universal_ckpt",
    "ds.value_head_prefix",
    "ds.zpg",
    "eval.split",
    "train.ema_beta",
    "train.enable_ema",
    "train.full_determinism_enable",
    "vllm.enable_prefix_caching",
    "vllm.sync_with_ray",
    "actor.optim",
    "actor.muon.lr",
    "actor.muon.momentum",
    "actor.muon.ns_steps",
    "actor.muon.nesterov",
    "actor.muon.no_nesterov",
    "actor.adam.betas",
    "actor.adam.eps",
    "actor.min_lr_ratio",
    "critic.optim",
    "critic.muon.lr",
    "critic.muon.momentum",
    "critic.muon.ns_steps",
    "critic.muon.nesterov",
    "critic.muon.no_nesterov",
    "critic.adam.betas",
    "critic.adam.eps",
    "critic.min_lr_ratio",
    "critic.adam.weight_decay",
    "critic.max_norm",
    "critic.lr_scheduler",
    "critic.lr_warmup_ratio",
)
"""The rest of train_ppo_ray's flags (OpenRLHF at 2026-08): known, with no dverl equivalent."""

LEGACY = {
    "actor_learning_rate": "actor.adam.lr",
    "actor_num_gpus_per_node": "actor.num_gpus_per_node",
    "actor_num_nodes": "actor.num_nodes",
    "adam_betas": "actor.adam.betas",
    "adam_offload": "ds.adam_offload",
    "advantage_estimator": "algo.advantage.estimator",
    "agent_func_path": "train.agent_func_path",
    "apply_chat_template": "data.apply_chat_template",
    "async_queue_size": "train.async_queue_size",
    "async_train": "train.async_enable",
    "attn_implementation": "ds.attn_implementation",
    "aux_loss_coef": "actor.aux_loss_coef",
    "best_metric_key": "ckpt.best_metric_key",
    "ckpt_path": "ckpt.path",
    "colocate_actor_ref": "train.colocate_actor_ref",
    "colocate_all_models": "train.colocate_all",
    "colocate_critic_reward": "train.colocate_critic_reward",
    "critic_learning_rate": "critic.adam.lr",
    "critic_num_gpus_per_node": "critic.num_gpus_per_node",
    "critic_num_nodes": "critic.num_nodes",
    "critic_pretrain": "critic.model_name_or_path",
    "dataloader_num_workers": "data.dataloader_num_workers",
    "deepcompile": "ds.deepcompile",
    "deepspeed_enable_sleep": "ds.enable_sleep",
    "disable_ds_ckpt": "ckpt.disable_ds",
    "disable_fast_tokenizer": "data.disable_fast_tokenizer",
    "ds_tensor_parallel_size": "ds.tensor_parallel_size",
    "dual_clip": "actor.dual_clip",
    "dynamic_filtering": "algo.dynamic_filtering_enable",
    "dynamic_filtering_reward_range": "algo.dynamic_filtering_range",
    "ema_beta": "train.ema_beta",
    "enable_ema": "train.enable_ema",
    "enable_prefix_caching": "vllm.enable_prefix_caching",
    "enable_vllm_is_correction": "algo.advantage.is_correction_enable",
    "enforce_eager": "vllm.enforce_eager",
    "entropy_loss_coef": "actor.entropy_coef",
    "eps_clip": "actor.eps_clip",
    "eps_clip_low_high": "actor.eps_clip_low_high",
    "eval_dataset": "eval.dataset",
    "eval_n_samples_per_prompt": "eval.n_samples_per_prompt",
    "eval_split": "eval.split",
    "eval_steps": "eval.steps",
    "eval_temperature": "eval.temperature",
    "freeze_visual_encoder": "actor.freeze_visual_encoder",
    "freezing_actor_steps": "critic.freezing_steps",
    "full_determinism": "train.full_determinism_enable",
    "gamma": "algo.advantage.gamma",
    "generate_max_len": "rollout.max_new_tokens",
    "grad_accum_dtype": "ds.grad_accum_dtype",
    "gradient_checkpointing": "actor.gradient_checkpointing_enable",
    "gradient_checkpointing_use_reentrant": "actor.gradient_checkpointing_reentrant",
    "image_key": "data.image_key",
    "init_kl_coef": "algo.kl.init_coef",
    "input_key": "data.input_key",
    "input_template": "data.input_template",
    "kl_estimator": "algo.kl.estimator",
    "kl_horizon": "algo.kl.horizon",
    "kl_target": "algo.kl.target",
    "l2": "actor.adam.weight_decay",
    "label_key": "data.label_key",
    "lambd": "algo.advantage.lambd",
    "load_checkpoint": "ckpt.load_enable",
    "load_in_4bit": "ds.load_in_4bit",
    "logging_steps": "logger.logging_steps",
    "lora_alpha": "ds.lora.alpha",
    "lora_dropout": "ds.lora.dropout",
    "lora_rank": "ds.lora.rank",
    "lr_scheduler": "actor.lr_scheduler",
    "lr_warmup_ratio": "actor.lr_warmup_ratio",
    "max_ckpt_mem": "ckpt.max_mem",
    "max_ckpt_num": "ckpt.max_num",
    "max_epochs": "train.max_epochs",
    "max_images_per_prompt": "data.max_images_per_prompt",
    "max_len": "data.max_len",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_norm": "actor.max_norm",
    "max_samples": "data.max_samples",
    "micro_rollout_batch_size": "rollout.micro_batch_size",
    "micro_train_batch_size": "train.micro_batch_size",
    "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "no_advantage_std_norm": "algo.advantage.no_std_norm",
    "normalize_reward": "reward.normalize_enable",
    "num_episodes": "train.num_episodes",
    "overlap_comm": "ds.overlap_comm",
    "overlong_buffer_len": "reward.overlong_buffer_len",
    "overlong_penalty_factor": "reward.overlong_penalty_factor",
    "packing_samples": "ds.packing_samples",
    "param_dtype": "ds.param_dtype",
    "partial_rollout": "train.partial_rollout_enable",
    "policy_loss_type": "actor.policy_loss_type",
    "pretrain": "actor.model_name_or_path",
    "prompt_data": "data.prompt_dataset",
    "prompt_data_probs": "data.prompt_probs",
    "prompt_split": "data.prompt_split",
    "ref_num_gpus_per_node": "ref.num_gpus_per_node",
    "ref_num_nodes": "ref.num_nodes",
    "ref_reward_offload": "ref.offload",
    "remote_rm_url": "reward.remote_url",
    "reward_clip_range": "reward.clip_range",
    "reward_num_gpus_per_node": "reward.num_gpus_per_node",
    "reward_num_nodes": "reward.num_nodes",
    "reward_pretrain": "reward.model_name_or_path",
    "ring_attn_size": "ds.ring_attn_size",
    "ring_head_stride": "ds.ring_attn_head_stride",
    "rollout_batch_size": "rollout.batch_size",
    "rollout_max_tokens_per_gpu": "rollout.max_tokens_per_gpu",
    "save_hf_ckpt": "ckpt.save_hf",
    "save_path": "ckpt.output_dir",
    "save_steps": "ckpt.save_steps",
    "save_value_network": "critic.save_value_network",
    "seed": "train.seed",
    "stop_properly_penalty_coef": "reward.stop_properly_penalty_coef",
    "target_modules": "ds.lora.target_modules",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "train_batch_size": "train.batch_size",
    "train_max_tokens_per_gpu": "train.max_tokens_per_gpu",
    "use_ds_universal_ckpt": "ds.use_universal_ckpt",
    "use_dynamic_batch": "train.dynamic_batch_enable",
    "use_kl_loss": "algo.kl.use_loss",
    "use_liger_kernel": "ds.use_liger_kernel",
    "use_tensorboard": "logger.tensorboard_dir",
    "use_wandb": "logger.wandb.key",
    "value_clip": "critic.value_clip",
    "value_head_prefix": "ds.value_head_prefix",
    "vllm_enable_sleep": "vllm.enable_sleep",
    "vllm_generate_batch_size": "rollout.vllm_generate_batch_size",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_is_correction_type": "algo.advantage.is_correction_type",
    "vllm_is_truncated_threshold": "algo.advantage.is_correction_threshold",
    "vllm_num_engines": "vllm.num_engines",
    "vllm_sync_backend": "vllm.sync_backend",
    "vllm_sync_with_ray": "vllm.sync_with_ray",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "wandb_group": "logger.wandb.group",
    "wandb_org": "logger.wandb.org",
    "wandb_project": "logger.wandb.project",
    "wandb_run_name": "logger.wandb.run_name",
    "zero_stage": "ds.zero_stage",
    "zpg": "ds.zpg",
}
"""Underscore flags (OpenRLHF v0.10.1 and earlier; `--bf16`, `--prompt_max_len` and `--generate_max_len`
from before v0.9) and the dotted flag each became."""

KNOWN = frozenset(RULES) | frozenset(HANDLED) | frozenset(DROPPED) | frozenset(OTHER_FLAGS)

ESTIMATORS = {
    "gae": "ppo",
    "group_norm": "grpo",
    "dr_grpo": "grpo",
    "rloo": "rloo",
    "reinforce": "reinforce_plus_plus",
    "reinforce_baseline": "reinforce_plus_plus_baseline",
}

EITHER_ERA = frozenset({"local_rank", "use_ms"})
"""Undotted flags OpenRLHF still has today."""

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
IS_TYPES = ("tis", "icepop", "seq-mask-tis")
MARKER = "train_ppo_ray"


def parse_command(text: str) -> tuple[dict[str, Any], list[str], str | None]:
    """The `--key value` and bare `--flag` (true) options of train_ppo_ray's command line in `text` (a run
    script, or the command line alone), and the variables left unexpanded in it."""
    command = script_command(text, MARKER)
    if command is not None:
        words, unresolved = command.words, command.unresolved
    else:
        words = shlex.split("\n".join(logical_lines(text)), comments=True)
        unresolved = unresolved_names(words)
    options = command_flags(words)
    return options, unresolved, cut_note(command)


def _canonical(raw: dict[str, Any], result: Conversion) -> tuple[dict[str, Any], dict[str, str]]:
    """Each flag under its current dotted name, and the name each was written as; unknown flags are
    listed and left out."""
    options: dict[str, Any] = {}
    written: dict[str, str] = {}
    legacy, dotted = [], []
    for key, value in raw.items():
        if key in KNOWN and key not in LEGACY:
            name = key
            if "." in key:
                dotted.append(key)
            elif key not in EITHER_ERA:
                legacy.append(key)
        elif key in LEGACY:
            name = LEGACY[key]
            legacy.append(key)
        else:
            result.unmapped.append(
                Unmapped(
                    key,
                    value,
                    "not a train_ppo_ray flag of OpenRLHF (neither today's dotted flags nor the underscore "
                    "flags of v0.10.1 and earlier); check its spelling",
                )
            )
            continue
        if key == "bf16":
            name, value = "ds.param_dtype", "bf16" if as_bool(value) else "fp32"
        options[name] = value
        written[name] = key
    if dotted and legacy:
        result.notes.append(
            f"the script mixes OpenRLHF's dotted flags (--{dotted[0]}, ...) with the underscore flags of "
            f"v0.10.1 and earlier (--{legacy[0]}, ...); OpenRLHF itself accepts only one kind"
        )
    elif legacy:
        result.notes.append(
            "read as OpenRLHF v0.10.1 or earlier (underscore flags); OpenRLHF now spells them dotted "
            f"(--{legacy[0]} is --{LEGACY.get(legacy[0], legacy[0])})"
        )
    return options, written


def convert_openrlhf(text: str, name: str | None = None) -> Conversion:
    raw, unresolved, cut = parse_command(text)
    unresolved = [v for v in unresolved if any(f"${v}" in str(x).replace("{", "") for x in raw.values())]
    result = Conversion(manifest={})
    if cut:
        result.notes.append(cut)
    options, written = _canonical(raw, result)
    spec: dict[str, Any] = {}
    estimator = str(options.get("algo.advantage.estimator", "gae"))
    put(spec, "algorithm.name", ESTIMATORS.get(estimator, "grpo"))
    if estimator not in ESTIMATORS:
        result.unmapped.append(
            Unmapped(written["algo.advantage.estimator"], estimator, f"dverl maps {', '.join(ESTIMATORS)}")
        )
    if estimator == "dr_grpo":
        put(spec, "algorithm.normAdvByStd", False)
        put(spec, "algorithm.lossAggregation", "seq_mean_token_sum")
        result.notes.append("dr_grpo: grpo without the std division, losses summed over tokens")
    samples = as_int(options.get("rollout.n_samples_per_prompt", 1))
    if samples < 2 and estimator != "gae":
        result.notes.append(
            f"n_samples_per_prompt {samples}: {estimator} needs groups; samplesPerPrompt is 8"
        )
        options["rollout.n_samples_per_prompt"] = 8
    _roles(options, spec, estimator)
    if as_bool(options.get("algo.kl.use_loss", False)):
        put(spec, "algorithm.klIn", "loss")
    elif "algo.kl.init_coef" in options:
        put(spec, "algorithm.klIn", "reward")
    if "reward.model_name_or_path" in options and "reward.remote_url" not in options:
        put(spec, "data.rewardType", "reward_model")
        put(spec, "data.rewardModel", {"path": str(options["reward.model_name_or_path"])})
        reward = as_int(options.get("reward.num_nodes", 1)) * as_int(
            options.get("reward.num_gpus_per_node", 1)
        )
        put(spec, "roles.reward", {"replicas": max(1, reward), "resources": {"gpus": 1}})
    loggers = [
        t
        for t, flag in (("wandb", "logger.wandb.key"), ("tensorboard", "logger.tensorboard_dir"))
        if options.get(flag)
    ]
    if loggers:
        put(spec, "training.logging", loggers)
    _dtype(options, spec, result, written)
    _lengths(options, spec, result, written)
    _batches(options, spec, result, written)
    _correction(options, spec, result, written)
    _dapo(options, spec, result)
    if as_bool(options.get("train.async_enable", False)):
        put(spec, "training.maxStaleness", max(1, as_int(options.get("train.async_queue_size", 1))))
    elif "train.async_queue_size" in options:
        result.unmapped.append(
            Unmapped(
                written["train.async_queue_size"],
                options["train.async_queue_size"],
                "asynchronous training is off",
            )
        )
    if "actor.eps_clip_low_high" in options:
        low_high = str(options["actor.eps_clip_low_high"]).split()
        put(spec, "algorithm.clipLow", as_float(low_high[0]))
        put(spec, "algorithm.clipHigh", as_float(low_high[-1]))
    if "reward.remote_url" in options:
        url = str(options["reward.remote_url"])
        why = (
            "an OpenRLHF reward_func(queries, prompts, labels) file; write it as a dverl module:function"
            if url.endswith(".py")
            else "a reward server; write a module:function that calls it"
        )
        result.unmapped.append(Unmapped(written["reward.remote_url"], url, why))
        put(spec, "data.rewardType", "boxed")
    simple = {k: v for k, v in options.items() if k not in HANDLED}
    before = len(result.unmapped)
    apply_rules(simple, RULES, DROPPED, spec, result)
    for i in range(before, len(result.unmapped)):
        entry = result.unmapped[i]
        result.unmapped[i] = Unmapped(written.get(entry.field, entry.field), entry.value, entry.why)
    per_learner(spec, result)
    if get(spec, "data.train") is None:
        put(spec, "data.train", "train.jsonl")
        result.notes.append("--data.prompt_dataset not given: data.train is train.jsonl; set it")
    elif "/" in str(get(spec, "data.train")) and "." not in str(get(spec, "data.train")).rsplit("/", 1)[-1]:
        result.notes.append(
            f"data.train is {get(spec, 'data.train')!r}, a Hugging Face Hub dataset in OpenRLHF: save it as "
            "a jsonl/parquet file and set data.train to it"
        )
    if get(spec, "data.rewardType") is None:
        put(spec, "data.rewardType", "boxed")
        result.notes.append("no reward model or server given: data.rewardType is boxed")
    if as_float(get(spec, "algorithm.klCoef", 0)) > 0 and get(spec, "roles.reference") is None:
        put(spec, "roles.reference", {"replicas": 1, "resources": {"gpus": 1}})
    for variable in unresolved:
        result.notes.append(
            f"${variable} is not set in the script (the environment's, or a command's output): it is kept "
            "as written; replace it with the path on the machines that run the job"
        )
    result.manifest = manifest(job_name(name or options.get("logger.wandb.run_name"), "openrlhf-job"), spec)
    return result


def _roles(options: dict[str, Any], spec: dict[str, Any], estimator: str) -> None:
    learners = as_int(options.get("actor.num_nodes", 1)) * as_int(options.get("actor.num_gpus_per_node", 1))
    learner: dict[str, Any] = {"replicas": learners, "resources": {"gpus": 1}}
    if learners > 1:
        learner["sharding"] = "fsdp"
    put(spec, "roles.learner", learner)
    engines = as_int(options.get("vllm.num_engines", 1))
    tp = as_int(options.get("vllm.tensor_parallel_size", 1))
    put(spec, "roles.rollout", {"replicas": engines, "backend": VLLM.name, "resources": {"gpus": tp}})
    if estimator == "gae":
        critics = as_int(options.get("critic.num_nodes", 1)) * as_int(
            options.get("critic.num_gpus_per_node", 1)
        )
        put(spec, "roles.critic", {"replicas": max(1, critics), "resources": {"gpus": 1}})


def _dtype(
    options: dict[str, Any], spec: dict[str, Any], result: Conversion, written: dict[str, str]
) -> None:
    dtype = options.get("ds.param_dtype")
    if dtype is None:
        put(spec, "model.dtype", "bfloat16")
        result.notes.append("--ds.param_dtype not given: OpenRLHF's default bf16, model.dtype bfloat16")
    elif dtype == "fp32":  # an old script without --bf16
        put(spec, "model.dtype", "float32")
    elif dtype in DTYPES:
        put(spec, "model.dtype", DTYPES[dtype])
    else:
        result.unmapped.append(Unmapped(written["ds.param_dtype"], dtype, "expected bf16 or fp16"))


def _lengths(
    options: dict[str, Any], spec: dict[str, Any], result: Conversion, written: dict[str, str]
) -> None:
    """OpenRLHF bounds prompt + response by `--data.max_len` and the response by `--rollout.max_new_tokens`
    (unset: whatever the prompt leaves); a manifest bounds each on its own."""
    total = as_int(options["data.max_len"]) if "data.max_len" in options else None
    new = as_int(options["rollout.max_new_tokens"]) if "rollout.max_new_tokens" in options else None
    prompt = as_int(options["prompt_max_len"]) if "prompt_max_len" in options else None
    if new is not None:
        put(spec, "data.maxNewTokens", new)
    if total is None:
        return
    if prompt is None and new is not None:
        if total > new:
            put(spec, "data.maxPromptTokens", total - new)
            result.notes.append(
                f"data.maxPromptTokens is {written['data.max_len']} {total} - "
                f"{written['rollout.max_new_tokens']} {new} = {total - new}"
            )
        else:
            result.unmapped.append(
                Unmapped(
                    written["data.max_len"], total, f"leaves no room for a prompt after {new} new tokens"
                )
            )
    elif new is None:
        prompt = prompt or min(512, total // 2)
        put(spec, "data.maxPromptTokens", prompt)
        put(spec, "data.maxNewTokens", max(1, total - prompt))
        result.notes.append(
            f"{written['data.max_len']} {total} bounds prompt + response; a manifest bounds each: "
            f"data.maxPromptTokens {prompt}, data.maxNewTokens {max(1, total - prompt)}; move the split to "
            "fit your prompts"
        )
    elif prompt + new > total:
        result.notes.append(f"{written['data.max_len']} {total} is below the prompt and response budgets")


def _batches(
    options: dict[str, Any], spec: dict[str, Any], result: Conversion, written: dict[str, str]
) -> None:
    samples = as_int(options.get("rollout.n_samples_per_prompt", 1))
    if "train.batch_size" in options:  # OpenRLHF counts samples; a manifest counts prompts
        put(spec, "training.minibatchSize", max(1, as_int(options["train.batch_size"]) // samples))
    dynamic = as_bool(options.get("train.dynamic_batch_enable", False))
    budget = options.get("train.max_tokens_per_gpu")
    if dynamic:
        tokens = as_int(budget) if budget is not None else 16192
        put(spec, "training.microbatchTokens", tokens)
        if budget is None:
            result.notes.append(
                f"{written['train.dynamic_batch_enable']} without a token budget: OpenRLHF's default {tokens}"
            )
        if "train.micro_batch_size" in options:
            result.unmapped.append(
                Unmapped(
                    written["train.micro_batch_size"],
                    options["train.micro_batch_size"],
                    "dynamic batches: micro-batches are cut by training.microbatchTokens instead",
                )
            )
    else:
        if budget is not None:
            result.unmapped.append(
                Unmapped(
                    written["train.max_tokens_per_gpu"],
                    budget,
                    f"OpenRLHF reads it only with --{_spelled('train.dynamic_batch_enable', written)}; set "
                    "training.microbatchTokens to pack micro-batches by tokens",
                )
            )
        if "train.micro_batch_size" in options:  # already per GPU
            put(spec, "training.microbatchSize", max(1, as_int(options["train.micro_batch_size"]) // samples))
    if "rollout.batch_size" not in options:
        result.notes.append("--rollout.batch_size not given: training.batchSize is the default 8")


LEGACY_NAME = {dotted: legacy for legacy, dotted in LEGACY.items()}


def _spelled(flag: str, written: dict[str, str]) -> str:
    """`flag` as the script's era spells it (dotted, or its underscore name in an underscore script)."""
    underscore = any("." not in w for w in written.values()) and not any("." in w for w in written.values())
    return LEGACY_NAME.get(flag, flag) if underscore else flag


def _correction(
    options: dict[str, Any], spec: dict[str, Any], result: Conversion, written: dict[str, str]
) -> None:
    """OpenRLHF's vLLM importance-sampling correction as algorithm.rolloutCorrection: tis clamps each
    token's ratio into [low, high], icepop zeroes tokens outside it, seq-mask-tis drops sequences whose
    geometric-mean ratio is outside it."""
    enabled = as_bool(options.get("algo.advantage.is_correction_enable", False))
    kind = str(options.get("algo.advantage.is_correction_type", "tis"))
    band = [
        as_float(v) for v in str(options.get("algo.advantage.is_correction_threshold", "0.5 5.0")).split()
    ]
    low, high = (band[0], band[-1]) if band else (0.5, 5.0)
    if not enabled:
        for key in ("algo.advantage.is_correction_type", "algo.advantage.is_correction_threshold"):
            if key in options:
                result.unmapped.append(
                    Unmapped(written[key], options[key], "the correction is off in the script")
                )
        result.notes.append(
            "OpenRLHF's importance-sampling correction is off in the script; dverl corrects by default with "
            "a vllm rollout (algorithm.rolloutCorrection.enabled: false turns it off)"
        )
        return
    if kind not in IS_TYPES:
        result.unmapped.append(
            Unmapped(
                written.get("algo.advantage.is_correction_type", "is_correction_type"),
                kind,
                f"dverl maps {', '.join(IS_TYPES)}",
            )
        )
        kind = "tis"
    correction: dict[str, Any] = {"enabled": True, "importanceSampling": "token", "cap": max(1.0, high)}
    if kind == "icepop":
        correction.update(rejection="token", rejectLow=low, rejectHigh=high)
    elif kind == "seq-mask-tis":
        correction.update(rejection="sequence", rejectLow=low, rejectHigh=high)
    elif low != 0.5 or "algo.advantage.is_correction_threshold" in options:
        result.notes.append(
            f"tis: dverl caps the ratio at {high}; OpenRLHF's lower clamp {low} has no equivalent"
        )
    put(spec, "algorithm.rolloutCorrection", correction)


def _dapo(options: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    if as_bool(options.get("algo.dynamic_filtering_enable", False)):
        band = [as_float(v) for v in str(options.get("algo.dynamic_filtering_range", "0 1")).split()]
        put(spec, "algorithm.dynamicFilter", {"enabled": True, "low": band[0], "high": band[-1]})
    if "reward.overlong_buffer_len" in options:
        overlong: dict[str, Any] = {
            "enabled": True,
            "cacheLength": as_int(options["reward.overlong_buffer_len"]),
        }
        if "reward.overlong_penalty_factor" in options:
            overlong["penaltyFactor"] = as_float(options["reward.overlong_penalty_factor"])
        put(spec, "algorithm.overlong", overlong)
