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
    Conversion,
    Unmapped,
    apply_rules,
    as_bool,
    as_float,
    as_int,
    get,
    job_name,
    manifest,
    per_learner,
    put,
)
from decentralized_verl.convert.openrlhf_flags import (
    DROPPED,
    EITHER_ERA,
    HANDLED,
    KNOWN,
    LEGACY,
    RULES,
)
from decentralized_verl.convert.shell import (
    command_flags,
    cut_note,
    logical_lines,
    script_command,
    unresolved_names,
)
from decentralized_verl.spec.catalogue.backends import VLLM

ESTIMATORS = {
    "gae": "ppo",
    "group_norm": "grpo",
    "dr_grpo": "grpo",
    "rloo": "rloo",
    "reinforce": "reinforce_plus_plus",
    "reinforce_baseline": "reinforce_plus_plus_baseline",
}

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
