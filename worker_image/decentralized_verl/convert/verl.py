"""veRL's `ppo_trainer` config (`python -m verl.trainer.main_ppo` YAML and its Hydra `key=value`
overrides) as an RLHFJob manifest.

veRL puts actor, rollout and reference on the same GPUs and time-shares them (the hybrid engine);
a manifest gives rollout workers GPUs of their own, so the converted job asks for the learner's GPUs
plus the rollout's, and says so in its notes.
"""

from __future__ import annotations

import math
from pathlib import PurePath
from typing import Any

from decentralized_verl.convert.common import (
    GROUP_OVER,
    TRACKERS,
    Conversion,
    Unmapped,
    apply_rules,
    as_bool,
    as_float,
    as_int,
    flatten,
    get,
    job_name,
    load_yaml,
    manifest,
    per_learner,
    put,
)
from decentralized_verl.convert.hydra import ReadText, compose, load_mapping, resolve
from decentralized_verl.convert.shell import cut_note, script_command, unresolved_names
from decentralized_verl.convert.verl_keys import DROPPED, HANDLED, OB, RC, RULES, A
from decentralized_verl.spec.catalogue.backends import HF, VLLM

VERL_ROLLOUT_ENGINES = {"vllm": VLLM, "hf": HF, "sglang": VLLM}
"""veRL's rollout engines and the dverl backend each becomes (sglang's workers serve with vllm here)."""
POLICY_LOSSES = {"vanilla": "ppo_clip", "gspo": "gspo", "cispo": "cispo"}
"""veRL's actor.policy_loss.loss_mode to dverl's policy losses."""

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
        value = load_yaml(raw) if raw.strip() else None
        sets[key.strip()] = value
    return sets, removes


MAIN = "verl.trainer.main_ppo"


def command_overrides(text: str) -> tuple[list[str], list[str], dict[str, str], str | None] | None:
    """The `key=value` words of a `python -m verl.trainer.main_ppo ...` command line (a run script), the
    script variables left unexpanded in it, and its `--config-path`/`--config-name` if any; None when
    `text` holds no such command."""
    command = script_command(text, MAIN)
    if command is None:
        return None
    overrides, hydra = [], {}
    words = command.words[1:]
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--config-") or word in ("-cp", "-cn"):
            flag, _, value = word.partition("=")
            if not value and i + 1 < len(words):
                i, value = i + 1, words[i + 1]
            hydra["path" if flag in ("--config-path", "-cp") else "name"] = value
        elif "=" in word and not word.startswith("-"):
            overrides.append(word)
        i += 1
    return overrides, command.unresolved, hydra, cut_note(command)


def convert_verl(
    text: str,
    overrides: list[str],
    name: str | None = None,
    read: ReadText | None = None,
    where: str = "the config",
) -> Conversion:
    """`read` gives the files beside `where` (the config folder), to compose a `defaults:` list from."""
    result = Conversion(manifest={})
    from_command = command_overrides(text)
    unset: list[str] = []
    config: dict[str, Any] = {}
    if from_command is not None:
        words, unset, hydra, cut = from_command
        if cut:
            result.notes.append(cut)
        overrides = [*words, *overrides]
        if hydra.get("name"):
            config = _config_named(hydra, read, result)
        else:
            result.notes.append(
                "a main_ppo command line sets only what differs from veRL's ppo_trainer.yaml; every other "
                "setting takes dverl's default (convert the YAML with these overrides to carry veRL's)"
            )
    else:
        config = load_mapping(text, where) if text.strip() else {}
        if "defaults" in config:
            config = _composed(config, read, where, result)
    for key in ("defaults", "hydra"):  # Hydra's own keys
        config.pop(key, None)
    sets, removes = parse_overrides(overrides)
    for key, value in sets.items():
        put(config, key, value)
    for key in removes:
        parent, _, leaf = key.rpartition(".")
        node = get(config, parent) if parent else config
        if isinstance(node, dict):
            node.pop(leaf, None)
    resolved = resolve(config)
    flat = {k: v for k, v in flatten(resolved.config).items() if v is not None}
    flat = {k: v for k, v in flat.items() if k.rsplit(".", 1)[-1] != "_target_"}
    flat = _unused_sections(flat, result)
    mandatory = [k for k, v in flat.items() if v == "???"]
    if mandatory:
        result.notes.append(
            f"{', '.join(mandatory)}: ??? in veRL (a value every run must give); not given here, so "
            "dverl's default is used"
        )
        flat = {k: v for k, v in flat.items() if k not in mandatory}
    flat = _unset_values(flat, unset, result)
    _environment(flat, unset, resolved.environment, result)
    interpolated = {
        k: v
        for k, v in flat.items()
        if isinstance(v, str)
        and "${" in v
        and k not in resolved.environment
        and not _only_script_variables(v, unset)  # the script's environment, noted below
    }
    for key, value in interpolated.items():
        result.unmapped.append(
            Unmapped(key, value, "a Hydra interpolation naming nothing here; give the value")
        )
    flat = {k: v for k, v in flat.items() if k not in interpolated and k not in resolved.environment}
    return _convert_flat(flat, name, result)


def _config_named(hydra: dict[str, str], read: ReadText | None, result: Conversion) -> dict[str, Any]:
    name = hydra["name"].removesuffix(".yaml") + ".yaml"
    path = hydra.get("path", "")
    file = f"{path.rstrip('/')}/{name}" if path else name
    text = read(file) if read is not None else None
    if text is None:
        result.notes.append(
            f"the command composes --config-name {hydra['name']} (--config-path {path or '.'}), which is not "
            "beside the script: only the command line's overrides are converted"
        )
        return {}
    composed = compose(file, read) if read is not None else None
    assert composed is not None
    _composed_notes(composed, file, result)
    return composed.config


def _composed(
    config: dict[str, Any], read: ReadText | None, where: str, result: Conversion
) -> dict[str, Any]:
    if read is None:
        result.notes.append(
            f"{where} has a Hydra defaults: list, and its config folder is not at hand (read from stdin): "
            "the sections it names (actor, rollout, model, data, ...) are left out; give the file's path"
        )
        return config
    composed = compose(PurePath(where).name, read, primary=config)
    _composed_notes(composed, where, result)
    return composed.config


def _composed_notes(composed: Any, where: str, result: Conversion) -> None:
    files = composed.read
    if files:
        result.notes.append(f"composed {where}'s Hydra defaults from {len(set(files))} file(s) of its folder")
    if composed.missing:
        result.notes.append(
            f"{where}'s defaults name {', '.join(composed.missing)}, not in its folder: those sections are "
            "left out (keep veRL's config folder beside the file)"
        )


def _only_script_variables(value: str, unset: list[str]) -> bool:
    names = set(unresolved_names([value]))
    return bool(names) and names <= set(unset)


def _unset_values(flat: dict[str, Any], unset: list[str], result: Conversion) -> dict[str, Any]:
    """A value that is only an unset script variable (`${mini_batch_size}`, `$ARNOLD_WORKER_GPU`) or empty
    cannot be converted; a path that starts with one (`$HOME/data/...`) is kept and noted."""
    kept: dict[str, Any] = {}
    for key, value in flat.items():
        text = value if isinstance(value, str) else None
        if text is not None and text.strip() == "":
            result.unmapped.append(Unmapped(key, value, "empty in the script; give the value"))
        elif (
            text is not None
            and unresolved_names([text])
            and set(unresolved_names([text])) <= set(unset)
            and "/" not in text
        ):
            result.unmapped.append(
                Unmapped(
                    key,
                    value,
                    "set from a variable the script does not set (the environment's?); give the value",
                )
            )
        else:
            kept[key] = value
    return kept


def _environment(
    flat: dict[str, Any], unset: list[str], from_env: dict[str, str], result: Conversion
) -> None:
    """Environment variables stay as written: they belong to the machines that run the job."""
    for variable in unset:
        keys = [k for k, v in flat.items() if f"${variable}" in str(v).replace("{", "")]
        if keys:  # the others were listed as unmapped
            result.notes.append(
                f"${variable} is not set in the script ({', '.join(keys)}): kept as written; it must name a "
                "path on the machines that run the job"
            )
    home = [k for k, v in flat.items() if isinstance(v, str) and v.startswith("~/")]
    if home:
        result.notes.append(
            f"{', '.join(home)} start with ~, the home folder of whoever runs the job: kept as written; "
            "give a path that exists on the machines that run it"
        )
    for key, variable in from_env.items():
        result.unmapped.append(
            Unmapped(
                key,
                f"${{oc.env:{variable}}}",
                f"read from the environment variable {variable}; give the value",
            )
        )


def _unused_sections(flat: dict[str, Any], result: Conversion) -> dict[str, Any]:
    """A composed config carries every role's section; one for a role the run does not start (the critic
    of a critic-free algorithm, a disabled reward model) is one line, not dozens."""
    unused = {}
    if flat.get("algorithm.adv_estimator", "gae") != "gae":
        unused["critic"] = f"{flat.get('algorithm.adv_estimator')} trains no critic"
    if "reward_model.enable" in flat and not as_bool(flat["reward_model.enable"]):
        unused["reward_model"] = "reward_model.enable is false"
    for section, why in unused.items():
        keys = [k for k in flat if k.startswith(section + ".") and k != "reward_model.enable"]
        if len(keys) > GROUP_OVER:
            result.unmapped.append(Unmapped(f"{section}.*", f"{len(keys)} keys", why))
            flat = {k: v for k, v in flat.items() if k not in keys}
    return flat


def _convert_flat(flat: dict[str, Any], name: str | None, result: Conversion) -> Conversion:
    spec: dict[str, Any] = {}
    _algorithm(flat, spec, result)
    _correction(flat, spec, result)
    _overlong(flat, spec)
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
    _loss_settings(spec, result)
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


def _loss_settings(spec: dict[str, Any], result: Conversion) -> None:
    """veRL keeps clip_ratio_c and loss_agg_mode whatever the loss; dverl rejects settings a policy loss
    does not read, so those are listed instead of carried."""
    algorithm = spec.get("algorithm", {})
    loss = algorithm.get("policyLoss")
    if loss in ("gspo", "cispo") and "dualClip" in algorithm:
        value = algorithm.pop("dualClip")
        result.unmapped.append(
            Unmapped(f"{A}.actor.clip_ratio_c", value, f"the {loss} loss has no dual clip")
        )
    if loss == "gspo" and algorithm.get("lossAggregation", "seq_mean_token_mean") != "seq_mean_token_mean":
        value = algorithm.pop("lossAggregation")
        result.unmapped.append(
            Unmapped(
                f"{A}.actor.loss_agg_mode",
                value,
                "dverl's gspo averages over sequences (seq-mean-token-mean)",
            )
        )


def _correction(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    """veRL's algorithm.rollout_correction: `rollout_is` weights per token or sequence truncated at
    `rollout_is_threshold`; `bypass_mode` takes the ratio against the rollout's log-probs (dverl's
    enabled: false). Its rejection criteria (`rollout_rs`, KL-based) have no dverl twin and stay listed."""
    level = flat.get(f"{RC}.rollout_is")
    bypass = as_bool(flat.get(f"{RC}.bypass_mode", False))
    if bypass:
        put(spec, "algorithm.rolloutCorrection", {"enabled": False})
        if level is not None:
            result.notes.append(
                f"{RC}.bypass_mode: rollout_is {level} is not applied (dverl's bypass has none)"
            )
        return
    if level is None:
        return
    if level not in ("token", "sequence"):
        result.unmapped.append(Unmapped(f"{RC}.rollout_is", level, "dverl weighs per token or per sequence"))
        return
    correction = {"enabled": True, "importanceSampling": level}
    if f"{RC}.rollout_is_threshold" in flat:
        correction["cap"] = max(1.0, as_float(flat[f"{RC}.rollout_is_threshold"]))
    put(spec, "algorithm.rolloutCorrection", correction)


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
    mode = flat.get(f"{A}.actor.policy_loss.loss_mode")
    if mode is not None:
        if mode in POLICY_LOSSES:
            put(spec, "algorithm.policyLoss", POLICY_LOSSES[mode])
        else:
            result.unmapped.append(
                Unmapped(f"{A}.actor.policy_loss.loss_mode", mode, f"dverl maps {', '.join(POLICY_LOSSES)}")
            )
    low = flat.get(f"{A}.actor.clip_ratio_low")
    if low is not None and as_float(low) >= 1:  # 1 - low <= 0: no lower clip at all
        flat.pop(f"{A}.actor.clip_ratio_low")
        spec.get("algorithm", {}).pop("clipLow", None)
        result.unmapped.append(
            Unmapped(
                f"{A}.actor.clip_ratio_low",
                low,
                "1 - clip_ratio_low <= 0 clips nothing from below; dverl's default for the loss applies "
                "(cispo: no lower clip)",
            )
        )


def _overlong(flat: dict[str, Any], spec: dict[str, Any]) -> None:
    """DAPO's soft overlong punishment, a reward-manager option in veRL, is algorithm.overlong here."""
    if as_bool(flat.get(f"{OB}.enable", False)):
        overlong: dict[str, Any] = {"enabled": True}
        if f"{OB}.len" in flat:
            overlong["cacheLength"] = as_int(flat[f"{OB}.len"])
        if f"{OB}.penalty_factor" in flat:
            overlong["penaltyFactor"] = as_float(flat[f"{OB}.penalty_factor"])
        put(spec, "algorithm.overlong", overlong)


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


def _count(flat: dict[str, Any], key: str, result: Conversion) -> int:
    """A GPU count; one the script leaves to an environment variable (`$SLURM_GPUS_PER_NODE`) is 1, noted."""
    try:
        return as_int(flat.get(key, 1))
    except (TypeError, ValueError):
        result.unmapped.append(Unmapped(key, flat[key], "not a number (an environment variable?); 1 is used"))
        return 1


def _roles(flat: dict[str, Any], spec: dict[str, Any], result: Conversion) -> None:
    gpus = _count(flat, "trainer.n_gpus_per_node", result) * _count(flat, "trainer.nnodes", result)
    tp = _count(flat, f"{A}.rollout.tensor_model_parallel_size", result)
    learner = {"replicas": gpus, "resources": {"gpus": 1}}
    if gpus > 1:
        learner["sharding"] = "fsdp"
    put(spec, "roles.learner", {**get(spec, "roles.learner", {}), **learner})
    rollout = {"replicas": max(1, gpus // tp), "resources": {"gpus": tp}}
    put(spec, "roles.rollout", {**get(spec, "roles.rollout", {}), **rollout})
    engine = str(flat.get(f"{A}.rollout.name", "vllm"))
    backend = VERL_ROLLOUT_ENGINES.get(engine)
    if backend is None:
        reason = "dverl's rollout backends are vllm and hf"
        result.unmapped.append(Unmapped(f"{A}.rollout.name", engine, reason))
    elif backend.name != engine:
        result.notes.append(f"{A}.rollout.name {engine}: dverl's rollout workers serve with {backend.name}")
    put(spec, "roles.rollout.backend", (backend or VLLM).name)
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
    budget = flat.get(f"{A}.actor.ppo_max_token_len_per_gpu")
    if as_bool(flat.get(f"{A}.actor.use_dynamic_bsz", False)):
        tokens = as_int(budget) if budget is not None else 16384
        put(spec, "training.microbatchTokens", tokens)
        if budget is None:
            result.notes.append(
                f"actor.use_dynamic_bsz without ppo_max_token_len_per_gpu: veRL's default {tokens}"
            )
        if micro is not None:
            result.unmapped.append(
                Unmapped(
                    f"{A}.actor.ppo_micro_batch_size_per_gpu",
                    micro,
                    "dynamic batches: micro-batches are cut by training.microbatchTokens instead",
                )
            )
        return
    if budget is not None:
        result.unmapped.append(
            Unmapped(
                f"{A}.actor.ppo_max_token_len_per_gpu",
                budget,
                "veRL reads it only with actor.use_dynamic_bsz; set training.microbatchTokens to pack "
                "by tokens",
            )
        )
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
