"""Turn a YAML file or a dict into a validated RLHFJob, or a ManifestError listing every problem.

The same function serves `dverl validate`, `dverl run`, the workers and the operator, so a manifest
is judged the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.spec import safe_yaml
from decentralized_verl.spec.base import CrossFieldProblems
from decentralized_verl.spec.catalogue.algorithms import GROUP_ESTIMATORS
from decentralized_verl.spec.job import API_GROUP, API_VERSION, KIND, JobSpec, RLHFJob
from decentralized_verl.spec.safe_yaml import DuplicateKey, YamlLimitExceeded


def _path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("function-after", "function-before") or str(item).startswith(
            ("function-", "tagged-union", "literal[")
        ):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


QUOTE_LIMIT = 200
"""Characters of an offending value an error quotes (YAML aliases can expand a few bytes into megabytes)."""

HINTS = {
    "int_from_float": "write a whole number without a decimal point or exponent",
    "float_type": "a quoted number is a string: remove the quotes",
    "int_type": "a quoted number is a string: remove the quotes",
    "bool_type": "write true or false without quotes",
}


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to `limit` characters with how much was left out."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _describe(error: dict[str, Any]) -> str:
    """Say what is wrong in the words of the manifest, with the offending value (quoted in short)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    given = _Quoted(quote(error.get("input")))
    bounds = {
        "greater_than": ("gt", ">"),
        "greater_than_equal": ("ge", ">="),
        "less_than": ("lt", "<"),
        "less_than_equal": ("le", "<="),
    }
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind in bounds:
        key, op = bounds[kind]
        return f"must be {op} {ctx.get(key)} (got {given!r})"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')} (got {given!r})"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return f"{error['msg'].lower()} (got {given!r})"
    message = error["msg"].removeprefix("Value error, ")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind in ("literal_error", "int_from_float"):
        hint = _hint(kind, error.get("input"))
        return f"{message} (got {given!r}){hint}"
    return message


def _hint(kind: str, given: Any) -> str:
    if kind == "int_type" and isinstance(given, float):
        kind = "int_from_float"
    elif kind in ("float_type", "int_type") and not isinstance(given, str):
        return ""
    return f"; {HINTS[kind]}" if kind in HINTS else ""


class _Quoted(str):
    """A value already quoted (and shortened): `{x!r}` shows it as is."""

    def __repr__(self) -> str:
        return str(self)


def problems_from_validation_error(exc: ValidationError, prefix: str = "") -> list[Problem]:
    """Flatten pydantic's errors into field-path problems, expanding our cross-field reports."""
    problems: list[Problem] = []
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, CrossFieldProblems):
            problems.extend(cause.problems)
            continue
        path = _path(error["loc"])
        full = f"{prefix}.{path}" if prefix and path else (prefix or path)
        problems.append(Problem(full or "(root)", _describe(error)))
    return problems


def parse_job(document: Any, source: str | None = None) -> RLHFJob:
    """Validate one parsed YAML document as an RLHFJob; raises ManifestError with every problem."""
    if not isinstance(document, dict):
        kind = "empty" if document is None else type(document).__name__
        raise ManifestError(
            [Problem("(root)", f"expected a mapping (an RLHFJob object), got {kind}")], source
        )
    problems: list[Problem] = []
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind is None and api_version is None and STAGE_KEYS & set(document):
        raise ManifestError(
            [
                Problem(
                    "(root)",
                    "this is a stages config (sft/reward/rlhf), not an RLHFJob manifest: run it with "
                    "`dverl train --stage all --config FILE`",
                )
            ],
            source,
        )
    if kind != KIND:
        problems.append(Problem("kind", f"expected {KIND!r} (got {kind!r}): this is not an RLHFJob manifest"))
    if api_version != f"{API_GROUP}/{API_VERSION}":
        problems.append(Problem("apiVersion", f"expected '{API_GROUP}/{API_VERSION}' (got {api_version!r})"))
    if problems:
        raise ManifestError(problems, source)
    try:
        return RLHFJob.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(problems_from_validation_error(exc), source) from None


def parse_spec(spec: Any, source: str | None = None) -> JobSpec:
    """Validate a bare `.spec` (what the operator and the workers receive)."""
    if not isinstance(spec, dict):
        raise ManifestError([Problem("spec", f"expected a mapping, got {type(spec).__name__}")], source)
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        raise ManifestError(problems_from_validation_error(exc, prefix="spec"), source) from None


STAGE_KEYS = {"sft", "reward", "rlhf"}
"""Top-level sections of a `dverl train` stages config, told apart from a manifest with a hint."""


def load_yaml_documents(text: str, source: str) -> list[Any]:
    """Every non-empty YAML document in `text`, within the loader's limits (duplicate keys refused);
    ManifestError naming the line or the limit."""
    try:
        return [doc for doc in safe_yaml.load_documents(text) if doc is not None]
    except (DuplicateKey, YamlLimitExceeded) as exc:
        raise ManifestError([Problem("(file)", str(exc))], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError([Problem("(file)", f"not valid YAML: {where}{problem}")], source) from None


def load_yaml_text(text: str, source: str) -> Any:
    documents = load_yaml_documents(text, source)
    if not documents:
        return None
    if len(documents) != 1:
        raise ManifestError(
            [Problem("(file)", f"expected exactly one YAML document, found {len(documents)}")], source
        )
    return documents[0]


def load_job(path: str | Path) -> RLHFJob:
    """Read and validate an RLHFJob manifest file."""
    path = Path(path)
    return parse_job(load_yaml_text(read_yaml_file(path), str(path)), str(path))


def read_yaml_file(path: str | Path) -> str:
    """A YAML file's text, read no further than the loader's size limit; errors name the file."""
    try:
        return safe_yaml.read_limited(path)
    except FileNotFoundError:
        raise ManifestError([Problem("(file)", "no such file")], str(path)) from None
    except YamlLimitExceeded as exc:
        raise ManifestError([Problem("(file)", str(exc))], str(path)) from None
    except (UnicodeDecodeError, IsADirectoryError) as exc:
        raise ManifestError([Problem("(file)", f"cannot read as text: {exc}")], str(path)) from None


def warnings_for(spec: JobSpec) -> list[Problem]:
    """Settings that validate but teach the model nothing; said, not refused (a person may mean them)."""
    warnings: list[Problem] = []
    estimator = spec.advantage_estimator
    if spec.data.temperature == 0 and estimator in GROUP_ESTIMATORS:
        warnings.append(
            Problem(
                "spec.data.temperature",
                f"0 samples greedily, so every sample of a prompt is the same and {estimator!r} "
                "advantages (each sample against its group) are all 0: no learning signal; use > 0",
            )
        )
    if spec.algorithm.samples_per_prompt == 1 and estimator in GROUP_ESTIMATORS:
        warnings.append(
            Problem(
                "spec.algorithm.samplesPerPrompt",
                f"1 sample per prompt gives {estimator!r} no group to compare against: no learning signal",
            )
        )
    return warnings


def summary(job: RLHFJob) -> str:
    """The one-line description `dverl validate` prints for a valid job."""
    spec = job.spec
    roles = ", ".join(f"{name}={role.replicas}" for name, role in spec.roles.items())
    if spec.roles.rollout.spans is not None:
        roles += f" (rollout as {spec.roles.rollout.spans.count} layer spans)"
    length = f"{spec.training.steps} steps" if spec.training.steps else f"{spec.training.epochs} epochs"
    correction = spec.rollout_correction
    corrected = ""
    if correction is not None:
        corrected = (
            f", rollout correction IS {correction.importance_sampling} / rejection {correction.rejection}"
        )
    kl = f", KL coef {spec.algorithm.kl_coef:g}"
    if spec.roles.reference is None:
        kl = ", KL to the initial policy not measured (no roles.reference)"
    env = spec.data.environment
    reward = f"reward {spec.data.reward_type}"
    if env is not None:
        reward = f"environment {env.name} (up to {env.max_turns} turns, it scores the episodes)"
    return (
        f"RLHFJob {job.metadata.name}: valid — {spec.algorithm.name} "
        f"({spec.advantage_estimator} advantages, {spec.policy_loss} loss, "
        f"{spec.algorithm.samples_per_prompt} samples/prompt{corrected}{kl}), "
        f"{reward}, {length}, roles {roles}"
    )
