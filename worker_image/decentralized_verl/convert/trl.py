"""TRL's `GRPOConfig` (its fields as JSON or YAML, as `trl grpo --config` reads them, with the script's
`model_name_or_path`, `dataset_name` and `reward_funcs` beside them) as an RLHFJob manifest.

TRL counts a step's batch in completions per device (`per_device_train_batch_size` x
`gradient_accumulation_steps` x processes, `num_generations` of them per prompt); a manifest counts
prompts (`training.batchSize`, each with `algorithm.samplesPerPrompt` samples).
"""

from __future__ import annotations

from typing import Any

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
    lora_targets,
    manifest,
    put,
)
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
    "lora_r": ("model.lora.rank", as_int),
    "lora_alpha": ("model.lora.alpha", as_float),
    "lora_target_modules": ("model.lora.targetModules", lora_targets),
    "run_name": ("training.tracking.runName", str),
    "log_completions": ("training.tracking.samplesEvery", lambda v: 10 if as_bool(v) else 0),
    "num_completions_to_print": ("training.tracking.samples", as_int),
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
    "torch_dtype": "the model's dtype is model.dtype",
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
}
"""TRL loss_type: (dverl loss aggregation, normAdvByStd or None to keep)."""


def _load(text: str) -> dict[str, Any]:
    loaded = safe_yaml.load_json_or_yaml(text)
    if not isinstance(loaded, dict):
        raise ValueError("a GRPOConfig is a JSON or YAML mapping of its fields")
    return loaded


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
    rewards = [rewards] if isinstance(rewards, str) else list(rewards or [])
    if rewards:
        put(spec, "data.rewardType", rewards[0] if ":" in str(rewards[0]) else "boxed")
        if ":" not in str(rewards[0]):
            result.unmapped.append(
                Unmapped("reward_funcs", rewards[0], "not a module:function; data.rewardType is boxed")
            )
        for extra in rewards[1:]:
            result.unmapped.append(
                Unmapped("reward_funcs", extra, "dverl takes one reward; sum them in one module:function")
            )
    else:
        put(spec, "data.rewardType", "boxed")
        result.notes.append("reward_funcs not given (a GRPOTrainer argument): data.rewardType is boxed")


def _choices(config: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    loss = config.get("loss_type")
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
    if as_bool(config.get("bf16", False)):
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
