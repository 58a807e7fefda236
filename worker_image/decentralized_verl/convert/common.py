"""What every importer shares: the manifest being built, the list of fields left out, the rules."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.spec import safe_yaml


def load_yaml(text: str) -> Any:
    """The one way the importers read YAML (configs, defaults files, override values): the project's
    loader with its limits, so a file built to exhaust the parser stops at a named limit."""
    return safe_yaml.load(text)


def load_json_or_yaml(text: str) -> Any:
    """JSON when the text is JSON, else YAML; both within the loader's limits."""
    return safe_yaml.load_json_or_yaml(text)


Convert = Callable[[Any], Any]
Rule = tuple[str, Convert | None]
"""(spec path, value conversion or None for as-is); a spec path is dotted camelCase under `spec`."""


NO_EQUIVALENT = "no dverl equivalent known to the converter"


@dataclass(frozen=True)
class Unmapped:
    """A source field the manifest does not carry, and why."""

    field: str
    value: Any
    why: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.why}"


@dataclass
class Conversion:
    manifest: dict[str, Any]
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the manifest assumes that the source did not say (defaults chosen, layouts changed)."""


def job_name(raw: str | None, fallback: str) -> str:
    """A DNS-1123 label of at most 40 characters made from a run or experiment name."""
    name = re.sub(r"[^a-z0-9-]+", "-", (raw or fallback).lower()).strip("-")[:40].strip("-")
    return name or fallback


def put(spec: dict[str, Any], path: str, value: Any) -> None:
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def get(spec: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested keys as dotted paths; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


SPEC_ORDER = ("model", "algorithm", "data", "roles", "training")


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The RLHFJob around `spec`, its sections in the order the examples write them."""
    ordered = {key: spec[key] for key in SPEC_ORDER if key in spec}
    ordered.update({k: v for k, v in spec.items() if k not in ordered})
    return {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": name}, "spec": ordered}


def as_int(value: Any) -> int:
    number = float(value)
    if number != int(number):
        raise ValueError(f"expected a whole number, got {value!r}")
    return int(number)


def as_float(value: Any) -> float:
    return float(value)


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
"""veRL / OpenRLHF KL estimator names to dverl's."""

LOSS_AGGREGATIONS = {
    "token-mean": "token_mean",
    "seq-mean-token-sum": "seq_mean_token_sum",
    "seq-mean-token-mean": "seq_mean_token_mean",
}

TRACKERS = ("tensorboard", "wandb", "mlflow")

LORA_ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_targets(value: Any) -> list[str]:
    if value == "all-linear":
        return list(LORA_ALL_LINEAR)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def apply_rules(
    flat: dict[str, Any],
    rules: dict[str, Rule],
    dropped: dict[str, str],
    spec: dict[str, Any],
    result: Conversion,
) -> None:
    """Put each mapped field into `spec`; every other field goes to `result.unmapped` with its reason."""
    for key, value in flat.items():
        if key in rules:
            path, conv = rules[key]
            try:
                put(spec, path, conv(value) if conv is not None else value)
            except (TypeError, ValueError, KeyError) as exc:
                result.unmapped.append(Unmapped(key, value, f"cannot be read as spec.{path}: {exc}"))
        elif key in dropped:
            result.unmapped.append(Unmapped(key, value, dropped[key]))
        else:
            result.unmapped.append(Unmapped(key, value, NO_EQUIVALENT))


def per_learner(spec: dict[str, Any], result: Conversion, total_paths: tuple[str, ...] = ()) -> None:
    """The sources count a step's prompts (and mini-batches) over all learners; a manifest counts them per
    learner replica. Divide, and size each rollout request so the rollout workers share a step evenly."""
    learners = int(get(spec, "roles.learner.replicas", 1) or 1)
    for path in ("training.batchSize", "training.minibatchSize", *total_paths):
        value = get(spec, path)
        if value is None or learners == 1:
            continue
        share = max(1, value // learners)
        if value % learners:
            result.notes.append(f"{path}: {value} over {learners} learners is not whole; {share} each")
        put(spec, path, share)
    _fit_micro(spec, result)
    _fit_sharding(spec, result)
    if get(spec, "training.evalEvery", 0) and get(spec, "data.eval") is None:
        every = spec["training"].pop("evalEvery")
        result.notes.append(
            f"evaluation every {every} steps needs an eval file (data.eval); none given, so none"
        )
    rollouts = int(get(spec, "roles.rollout.replicas", 1) or 1)
    step = learners * int(get(spec, "training.batchSize", 8))
    if (rollouts > 1 or learners > 1) and step % rollouts == 0:
        put(spec, "roles.rollout.batchSize", step // rollouts)
    elif rollouts > 1:
        result.notes.append(
            f"a step's {step} prompts do not split evenly over {rollouts} rollout workers; set "
            "roles.rollout.batchSize and replicas so they do"
        )


def _fit_sharding(spec: dict[str, Any], result: Conversion) -> None:
    """LoRA adapters train replicated (ddp), and only fsdp offloads to the CPU: the sources' GPU layouts
    are adjusted to what the spec accepts, each change noted."""
    learner = get(spec, "roles.learner", {})
    if get(spec, "model.lora") is not None and learner.get("sharding") == "fsdp":
        learner["sharding"] = "ddp"
        result.notes.append("model.lora: the learners replicate the model (sharding ddp); adapters are small")
    if learner.get("cpuOffload") and learner.get("sharding") != "fsdp":
        del learner["cpuOffload"]
        result.unmapped.append(
            Unmapped(
                "roles.learner.cpuOffload",
                True,
                "dverl offloads with fsdp only, and this learner is not sharded",
            )
        )


def _fit_micro(spec: dict[str, Any], result: Conversion) -> None:
    """A micro-batch must divide its mini-batch: samples per GPU turned into prompts rarely do, so take
    the largest that does."""
    micro = get(spec, "training.microbatchSize")
    mini = get(spec, "training.minibatchSize", get(spec, "training.batchSize"))
    if micro is None or mini is None or mini % micro == 0:
        return
    fitted = max(d for d in range(1, min(micro, mini) + 1) if mini % d == 0)
    put(spec, "training.microbatchSize", fitted)
    result.notes.append(f"training.microbatchSize {micro} does not divide the mini-batch of {mini}: {fitted}")


GROUP_OVER = 3
"""More unmapped keys of one group than this, all without an equivalent, print as one line."""


def group_of(field: str, depth: int) -> str:
    """The section a dotted key belongs to: its first `depth` parts (one more under veRL's
    actor_rollout_ref), never the whole key."""
    parts = field.split(".")
    depth += parts[0] == "actor_rollout_ref"
    return ".".join(parts[: max(1, min(depth, len(parts) - 1))])


def summary_lines(unmapped: list[Unmapped]) -> list[str]:
    """One line per unmapped field, except that many fields without an equivalent in one section (a fully
    composed config has hundreds: profiler, engine and checkpoint knobs) become one line with their count:
    by subsection first (`critic.profiler.*: 13 keys`), and what is left by section; a subsection that
    recurs in several sections (every role's `profiler`) is one line for all of them."""
    generic = [e for e in unmapped if e.why == NO_EQUIVALENT and "." in e.field]
    home: dict[int, str] = {}
    for depth in (2, 1):
        groups: dict[str, list[Unmapped]] = {}
        for entry in generic:
            if id(entry) not in home:
                groups.setdefault(group_of(entry.field, depth), []).append(entry)
        for group, members in groups.items():
            if len(members) > GROUP_OVER:
                home.update((id(m), group) for m in members)
    sections_of: dict[str, set[str]] = {}
    for group in set(home.values()):
        if "." in group:
            sections_of.setdefault(group.rsplit(".", 1)[-1], set()).add(group)
    label = {
        group: f"*.{leaf}"
        for leaf, groups in sections_of.items()
        if len(groups) >= GROUP_OVER
        for group in groups
    }
    lines: list[str] = []
    shown: set[str] = set()
    for entry in unmapped:
        group = home.get(id(entry))
        if group is None:
            lines.append(f"unmapped: {entry}")
            continue
        shown_as = label.get(group, group)
        if shown_as in shown:
            continue
        shown.add(shown_as)
        members = [e for e in generic if id(e) in home and label.get(home[id(e)], home[id(e)]) == shown_as]
        unique = list(dict.fromkeys(m.field[len(home[id(m)]) + 1 :] for m in members))
        names = ", ".join(unique[:4]) + (", ..." if len(unique) > 4 else "")
        where = ""
        if shown_as != group:
            where = " in " + ", ".join(sorted(g.rsplit(".", 1)[0] for g in label if label[g] == shown_as))
        lines.append(f"unmapped: {shown_as}.*: {len(members)} keys{where}, {NO_EQUIVALENT} ({names})")
    return lines
