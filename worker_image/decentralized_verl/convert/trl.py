"""TRL's `GRPOConfig` (its fields as JSON or YAML, as `trl grpo --config` reads them, with the script's
`model_name_or_path`, `dataset_name` and `reward_funcs` beside them) as an RLHFJob manifest.

TRL counts a step's batch in completions per device (`per_device_train_batch_size` x
`gradient_accumulation_steps` x processes, `num_generations` of them per prompt); a manifest counts
prompts (`training.batchSize`, each with `algorithm.samplesPerPrompt` samples).
"""

from __future__ import annotations

from typing import Any

import yaml

from decentralized_verl.convert.common import (
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
    load_json_or_yaml,
    lora_targets,
    manifest,
    put,
)
from decentralized_verl.convert.shell import command_flags, script_command
from decentralized_verl.spec import safe_yaml
from decentralized_verl.spec.catalogue.backends import HF, VLLM

RULES: dict[str, Rule] = {
    "model_name_or_path": ("model.path", str),
    "learning_rate": ("training.learningRate", as_float),
    "weight_decay": ("training.weightDecay", as_float),
    "warmup_steps": ("training.warmupSteps", as_int),
    "max_grad_norm": ("training.maxGradNorm", as_float),
    "max_steps": ("training.steps", lambda v: as_int(v) if as_int(v) > 0 else None),
    "num_train_epochs": ("training.epochs", lambda v: max(1, round(as_float(v)))),
    "seed": ("training.seed", as_int),
    "save_steps": ("training.checkpoint.every", lambda v: max(0, as_int(v))),
    "output_dir": ("training.checkpoint.dir", str),
    "eval_steps": ("training.evalEvery", as_int),
    "max_prompt_length": ("data.maxPromptTokens", as_int),
    "max_completion_length": ("data.maxNewTokens", as_int),
    "temperature": ("data.temperature", as_float),
    "top_p": ("data.topP", as_float),
    "top_k": ("data.topK", lambda v: max(0, as_int(v or 0))),
    "num_generations": ("algorithm.samplesPerPrompt", as_int),
    "beta": ("algorithm.klCoef", as_float),
    "epsilon": ("algorithm.clipLow", as_float),
    "epsilon_high": ("algorithm.clipHigh", as_float),
    "delta": ("algorithm.dualClip", as_float),
    "num_iterations": ("algorithm.ppoEpochs", as_int),
    "mask_truncated_completions": ("algorithm.maskTruncated", as_bool),
    "gradient_checkpointing": ("roles.learner.activationCheckpointing", as_bool),
    "activation_checkpointing": ("roles.learner.activationCheckpointing", as_bool),
    "lora_r": ("model.lora.rank", as_int),
    "lora_alpha": ("model.lora.alpha", as_float),
    "lora_target_modules": ("model.lora.targetModules", lora_targets),
    "run_name": ("training.tracking.runName", str),
    "log_completions": ("training.tracking.samplesEvery", lambda v: 10 if as_bool(v) else 0),
    "num_completions_to_print": ("training.tracking.samples", as_int),
    "system_prompt": ("data.systemPrompt", str),
    "entropy_coef": ("algorithm.entropyCoef", as_float),
    "dataset_test_split": ("data.eval", str),
}

HANDLED = {
    "per_device_train_batch_size": "training.batchSize (completions / num_generations)",
    "gradient_accumulation_steps": "training.batchSize (completions / num_generations)",
    "num_processes": "training.batchSize and roles.learner.replicas",
    "dataset_name": "data.train",
    "dataset_train_split": "data.train",
    "reward_funcs": "data.rewardType",
    "report_to": "training.logging",
    "loss_type": "algorithm.lossAggregation",
    "scale_rewards": "algorithm.normAdvByStd",
    "importance_sampling_level": "algorithm.policyLoss (sequence: gspo)",
    "use_vllm": "roles.rollout.backend",
    "use_peft": "model.lora",
    "bf16": "model.dtype",
    "fp16": "model.dtype",
    "dtype": "model.dtype",
    "torch_dtype": "model.dtype (TRL before 1.0)",
    "vllm_importance_sampling_correction": "algorithm.rolloutCorrection",
    "vllm_importance_sampling_mode": "algorithm.rolloutCorrection",
    "vllm_importance_sampling_clip_max": "algorithm.rolloutCorrection cap / rejectHigh",
    "vllm_importance_sampling_clip_min": "algorithm.rolloutCorrection rejectLow",
    "vllm_importance_sampling_cap": "algorithm.rolloutCorrection cap (deprecated in TRL)",
}

DROPPED = {
    "logging_steps": "metrics are written every step",
    "save_strategy": "checkpoints follow training.checkpoint.every",
    "eval_strategy": "evaluation follows training.evalEvery",
    "lr_scheduler_type": "dverl's schedule is linear warmup then constant",
    "warmup_ratio": "give warmup as training.warmupSteps",
    "optim": "dverl's learner uses AdamW",
    "remove_unused_columns": "dverl reads the columns it needs",
    "per_device_eval_batch_size": "evaluation batches are sized by the rollout workers",
    "vllm_mode": "rollout workers always run their own vLLM servers",
    "vllm_gpu_memory_utilization": "dverl plan sizes vLLM's memory share itself",
    "push_to_hub": "export a checkpoint with `dverl export` and push it yourself",
    "hub_model_id": "export a checkpoint with `dverl export` and push it yourself",
    "gradient_checkpointing_kwargs": "activation checkpointing has no options",
    "min_p": "dverl samples with temperature, topP and topK",
    "repetition_penalty": "dverl samples with temperature, topP and topK",
    "vllm_tensor_parallel_size": "a rollout worker's GPUs are roles.rollout.resources.gpus",
    "vllm_enable_sleep_mode": "rollout workers keep their own GPUs",
    "vllm_max_model_length": "the context follows data.maxPromptTokens + maxNewTokens",
    "trust_remote_code": "dverl loads models without remote code",
    "disable_dropout": "dverl's policies train without dropout",
    "num_generations_eval": "dverl evaluates with one greedy answer per prompt",
    "dataset_config": "data.train is a file; save the configuration you want",
    "cast_lm_head_to_fp32": "no dverl switch for the LM head's dtype (model.dtype)",
    "ds3_gather_for_generation": "rollout workers hold whole models; nothing is gathered",
    "pad_to_multiple_of": "dverl pads micro-batches itself",
    "vllm_model_impl": "vLLM's default model implementation is used",
    "vllm_server_base_url": "rollout workers' vLLM servers are started and addressed by dverl",
    "vllm_server_host": "rollout workers' vLLM servers are started and addressed by dverl",
    "vllm_server_port": "rollout workers' vLLM servers are started and addressed by dverl",
    "vllm_server_timeout": "rollout workers' vLLM servers are started and addressed by dverl",
    "vllm_group_port": "weights travel over gRPC to rollout workers",
    "vllm_structured_outputs_regex": "dverl has no constrained decoding",
    "sapo_temperature_neg": "dverl has no SAPO loss",
    "sapo_temperature_pos": "dverl has no SAPO loss",
    "vespo_k_pos": "dverl has no VESPO loss",
    "vespo_lambda_pos": "dverl has no VESPO loss",
    "vespo_k_neg": "dverl has no VESPO loss",
    "vespo_lambda_neg": "dverl has no VESPO loss",
    "multi_objective_aggregation": "dverl takes one reward function; combine rewards in it",
    "reward_weights": "dverl takes one reward function; weigh and sum rewards in it",
    "sync_ref_model": "dverl's reference model is not synced to the policy",
    "ref_model_mixup_alpha": "dverl's reference model is not synced to the policy",
    "ref_model_sync_steps": "dverl's reference model is not synced to the policy",
    "top_entropy_quantile": "dverl has no token selection by entropy",
    "use_adaptive_entropy": "the entropy coefficient is fixed (algorithm.entropyCoef)",
    "entropy_coef_min": "the entropy coefficient is fixed (algorithm.entropyCoef)",
    "entropy_coef_max": "the entropy coefficient is fixed (algorithm.entropyCoef)",
    "entropy_coef_delta": "the entropy coefficient is fixed (algorithm.entropyCoef)",
    "entropy_target": "the entropy coefficient is fixed (algorithm.entropyCoef)",
    "use_bias_correction_kl": "the KL estimator is algorithm.klEstimator",
    "off_policy_mask_threshold": "no equivalent; algorithm.skipThreshold bounds a mean ratio instead",
    "log_multimodal": "dverl trains text models",
    "log_unique_prompts": "samples are logged every training.tracking.samplesEvery steps",
    "log_completions_hub_repo": "samples go to the trackers (training.logging)",
    "use_transformers_continuous_batching": "the hf rollout backend batches its own way",
    "transformers_continuous_batching_config": "the hf rollout backend batches its own way",
    "use_transformers_paged": "the hf rollout backend batches its own way",
    "cache_implementation": "the hf rollout backend keeps its own KV cache",
    "generation_kwargs": "dverl samples with temperature, topP, topK and stop",
    "chat_template_kwargs": "prompts are rendered with the model's chat template as is",
    "max_tool_calling_iterations": "multi-turn episodes are data.environment (README, Multi-turn and tools)",
    "router_aux_loss_coef": "dverl has no MoE auxiliary loss",
    "model_init_kwargs": "the model loads from model.path in model.dtype",
    "attn_implementation": "dverl uses the model's default attention",
    "overwrite_output_dir": "a run folder is never overwritten; use a new --output",
    "save_total_limit": "use training.checkpoint.keep",
    "generation_batch_size": "rollout batches are roles.rollout.batchSize",
    "steps_per_generation": "one generation a step (use maxStaleness for asynchronous rollouts)",
    "shuffle_dataset": "dverl's sampler always shuffles, seeded by training.seed",
}

LOSS_TYPES = {
    "grpo": ("seq_mean_token_mean", None),
    "bnpo": ("token_mean", None),
    "dapo": ("token_mean", None),
    "dr_grpo": ("seq_mean_token_sum", False),
    "cispo": ("token_mean", None),
}
"""TRL loss_type: (dverl loss aggregation, normAdvByStd or None to keep)."""


DTYPES = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
}

IS_MODES = {
    "token_truncate": ("token", "off"),
    "token_mask": ("token", "token"),
    "sequence_truncate": ("sequence", "off"),
    "sequence_mask": ("sequence", "sequence"),
}
"""TRL's vllm_importance_sampling_mode: (dverl importanceSampling, rejection)."""


def _load(text: str) -> dict[str, Any]:
    try:
        loaded = load_json_or_yaml(text)
    except safe_yaml.YamlLimitExceeded:
        raise
    except yaml.YAMLError:
        loaded = None  # not a mapping: perhaps a command line
    if not isinstance(loaded, dict):
        command = script_command(text, "grpo")
        if command is None:
            raise ValueError(
                "a GRPOConfig is a JSON or YAML mapping of its fields, or a command line running a GRPO "
                "script (`trl grpo --flag value ...`, `accelerate launch grpo_*.py --flag value ...`)"
            )
        loaded = command_flags(command.words[1:])
    return loaded


def _correction(config: dict[str, Any], spec: dict[str, Any], result: Conversion, vllm: bool) -> None:
    """TRL corrects vLLM's log-probs by default since 1.x (sequence_mask, C_max 3); the fields map onto
    algorithm.rolloutCorrection, which applies to a vllm rollout too."""
    keys = [k for k in config if k.startswith("vllm_importance_sampling_")]
    if not vllm:
        for key in keys:
            result.unmapped.append(Unmapped(key, config[key], "corrects vLLM rollouts only; use_vllm is off"))
        return
    if not as_bool(config.get("vllm_importance_sampling_correction", True)):
        put(spec, "algorithm.rolloutCorrection", {"enabled": False})
        return
    mode = str(config.get("vllm_importance_sampling_mode", "sequence_mask"))
    if mode not in IS_MODES:
        result.unmapped.append(
            Unmapped("vllm_importance_sampling_mode", mode, f"dverl maps {', '.join(IS_MODES)}")
        )
        return
    level, rejection = IS_MODES[mode]
    high = config.get("vllm_importance_sampling_clip_max", config.get("vllm_importance_sampling_cap", 3.0))
    low = config.get("vllm_importance_sampling_clip_min")
    correction: dict[str, Any] = {"enabled": True, "importanceSampling": level}
    if high is not None:
        correction["cap"] = max(1.0, as_float(high))
    if rejection != "off":
        correction["rejection"] = rejection
        if high is not None:
            correction["rejectHigh"] = as_float(high)
        if low is not None:
            correction["rejectLow"] = as_float(low)
        else:
            result.notes.append(
                f"{mode}: TRL keeps ratios below C_max with no lower bound; dverl's rejectLow (0.5 unless "
                "set) applies"
            )
    elif low is not None:
        result.unmapped.append(
            Unmapped("vllm_importance_sampling_clip_min", low, "dverl's truncation caps from above only")
        )
    put(spec, "algorithm.rolloutCorrection", correction)


def convert_trl(text: str, name: str | None = None) -> Conversion:
    config = {k: v for k, v in _load(text).items() if v is not None}
    spec: dict[str, Any] = {"algorithm": {"name": "grpo"}}
    result = Conversion(manifest={})
    generations = as_int(config.get("num_generations", 8))
    per_device = as_int(config.get("per_device_train_batch_size", 8))
    accumulation = as_int(config.get("gradient_accumulation_steps", 1))
    processes = as_int(config.get("num_processes", 1))
    completions = per_device * accumulation  # per process: a manifest's batchSize is per learner
    prompts = max(1, completions // generations)
    put(spec, "training.batchSize", prompts)
    put(spec, "algorithm.samplesPerPrompt", generations)
    put(spec, "roles.learner", {"replicas": processes, "resources": {"gpus": 1}})
    if completions % generations:
        result.notes.append(
            f"{completions} completions a step is not a whole number of groups of {generations}; "
            f"training.batchSize is {prompts} prompts"
        )
    if "num_generations" not in config:
        result.notes.append("num_generations not given: TRL's default 8")
    if "beta" not in config:
        result.notes.append("beta not given: TRL's default 0.0 (no KL, no reference model)")
    _data(config, spec, result)
    _choices(config, spec, result)
    simple = {k: v for k, v in config.items() if k not in HANDLED}
    apply_rules(simple, RULES, DROPPED, spec, result)
    if get(spec, "training.steps") is None:
        spec.get("training", {}).pop("steps", None)
        if get(spec, "training.epochs") is None:
            put(spec, "training.epochs", 3)
            result.notes.append("num_train_epochs not given: TRL's default 3")
    elif get(spec, "training.epochs") is not None:
        del spec["training"]["epochs"]
    if as_float(get(spec, "algorithm.klCoef", 0)) > 0:
        put(spec, "roles.reference", {"replicas": 1, "resources": {"gpus": 1}})
    if "epsilon" in config and "epsilon_high" not in config:
        put(spec, "algorithm.clipHigh", as_float(config["epsilon"]))
    result.manifest = manifest(
        job_name(name or config.get("run_name") or config.get("output_dir"), "trl-grpo"), spec
    )
    return result


def reward_callable(name: str) -> str | None:
    """A reward function as dverl's module:function: TRL takes `module:function` or a dotted import path
    (`my_lib.rewards.accuracy`); a bare name is one of TRL's built-ins or the script's own."""
    if ":" in name:
        return name
    module, _, function = name.rpartition(".")
    return f"{module}:{function}" if module and function else None


def _data(config: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    dataset = config.get("dataset_name")
    put(spec, "data.train", str(dataset) if dataset else "train.jsonl")
    if dataset:
        result.notes.append(
            f"data.train is {dataset!r}, a Hugging Face Hub dataset in TRL: save its "
            f"{config.get('dataset_train_split', 'train')} split as a jsonl/parquet file and set "
            "data.train to it"
        )
    else:
        result.notes.append("dataset_name not given: data.train is train.jsonl; set it")
    rewards = config.get("reward_funcs")
    rewards = rewards.replace(",", " ").split() if isinstance(rewards, str) else list(rewards or [])
    if rewards:
        reward = reward_callable(str(rewards[0]))
        put(spec, "data.rewardType", reward or "boxed")
        if reward is None:
            result.unmapped.append(
                Unmapped(
                    "reward_funcs",
                    rewards[0],
                    "a TRL built-in or a bare name, not an import path; data.rewardType is boxed",
                )
            )
        for extra in rewards[1:]:
            result.unmapped.append(
                Unmapped("reward_funcs", extra, "dverl takes one reward; sum them in one module:function")
            )
    else:
        put(spec, "data.rewardType", "boxed")
        result.notes.append("reward_funcs not given (a GRPOTrainer argument): data.rewardType is boxed")


def _choices(config: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    loss = config.get("loss_type", "dapo")
    if "loss_type" not in config:
        result.notes.append("loss_type not given: TRL's default dapo (token_mean aggregation)")
    if loss is not None:
        if loss in LOSS_TYPES:
            aggregation, std = LOSS_TYPES[loss]
            put(spec, "algorithm.lossAggregation", aggregation)
            if std is not None:
                put(spec, "algorithm.normAdvByStd", std)
        else:
            result.unmapped.append(Unmapped("loss_type", loss, f"dverl maps {', '.join(LOSS_TYPES)}"))
    scale = config.get("scale_rewards")
    if scale is not None:
        if scale in (True, False, "group", "none", "false", "true"):
            put(spec, "algorithm.normAdvByStd", scale in (True, "group", "true"))
        else:
            result.unmapped.append(
                Unmapped("scale_rewards", scale, "dverl normalizes per group or not at all")
            )
    if loss == "cispo":
        put(spec, "algorithm.policyLoss", "cispo")
    if config.get("importance_sampling_level") == "sequence":
        put(spec, "algorithm.policyLoss", "gspo")
        aggregation = get(spec, "algorithm.lossAggregation")
        if aggregation not in (None, "seq_mean_token_mean"):
            del spec["algorithm"]["lossAggregation"]
            result.unmapped.append(
                Unmapped("loss_type", loss, "dverl's gspo averages over sequences (seq_mean_token_mean) only")
            )
    backend = (VLLM if as_bool(config.get("use_vllm", False)) else HF).name
    put(spec, "roles.rollout", {"replicas": 1, "backend": backend, "resources": {"gpus": 1}})
    _correction(config, spec, result, backend == VLLM.name)
    dtype = config.get("dtype", config.get("torch_dtype"))
    if dtype is not None and dtype != "auto":
        if dtype in DTYPES:
            put(spec, "model.dtype", DTYPES[dtype])
        else:
            key = "dtype" if "dtype" in config else "torch_dtype"
            result.unmapped.append(
                Unmapped(key, dtype, f"dverl's dtypes are {', '.join(sorted(set(DTYPES.values())))}")
            )
    elif as_bool(config.get("bf16", False)):
        put(spec, "model.dtype", "bfloat16")
    elif as_bool(config.get("fp16", False)):
        put(spec, "model.dtype", "float16")
    if as_bool(config.get("use_peft", False)) and get(spec, "model.lora") is None:
        put(spec, "model.lora", {})
    report = config.get("report_to")
    if report is not None:
        report = [report] if isinstance(report, str) else list(report)
        kept = [t for t in report if t in TRACKERS]
        for other in (t for t in report if t not in TRACKERS and t not in ("none", "all")):
            result.unmapped.append(Unmapped("report_to", other, "not a dverl tracker"))
        if "all" in report:
            kept = list(TRACKERS)
        if kept:
            put(spec, "training.logging", kept)
