"""Refuse spec changes that would silently restart a running learner (a new model or algorithm): the
applied spec keeps running, a condition and an Event say why, until the user suspends first. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec import JobSpec, safe_yaml
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.children.config_map import CONFIG_KEY
from dverl_operator.status import conditions as cond

RESTART_FIELDS = ("model", "algorithm")
"""Changing these restarts the learner (new weights, new loss): refused while pods run."""


@dataclass
class Refusal:
    effective: JobSpec
    """The spec to run: the applied one while a change is refused, else the new one."""
    conditions: list[dict[str, Any]]
    refused: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)


def applied_spec(config_map: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The spec the running pods were started with (rendered into the ConfigMap)."""
    if not config_map:
        return None
    text = (config_map.get("data") or {}).get(CONFIG_KEY)
    if not text:
        return None
    try:
        loaded = safe_yaml.load(text)
    except yaml.YAMLError:
        return None
    return loaded if isinstance(loaded, dict) else None


def refused_changes(old: Mapping[str, Any] | None, new: JobSpec) -> list[str]:
    """Fields that changed between the applied spec and the new one and need a learner restart."""
    if old is None:
        return []
    rendered = new.model_dump(mode="json", by_alias=True, exclude_none=True)
    return [f"spec.{name}" for name in RESTART_FIELDS if old.get(name) != rendered.get(name)]


def refuse_restart_changes(
    spec: JobSpec,
    config_map: Mapping[str, Any] | None,
    pods_running: bool,
    conditions: list[dict[str, Any]],
    now: float,
) -> Refusal:
    old = applied_spec(config_map)
    refused = refused_changes(old, spec) if pods_running and not spec.suspend else []
    if not refused:
        return Refusal(spec, cond.drop_condition(conditions, cond.SPEC_CHANGE_REFUSED))
    try:
        effective = parse_spec(old)  # keep running what was applied; the change waits
    except ManifestError:
        effective = spec
    message = (
        f"{', '.join(refused)} changed while the job runs; this needs the learner restarted: "
        "set spec.suspend: true first, then change it and resume"
    )
    events = []
    previous = cond.condition(conditions, cond.SPEC_CHANGE_REFUSED)
    if previous is None or previous.get("message") != message:
        events.append(("Warning", cond.SPEC_CHANGE_REFUSED, message))
    conditions = cond.set_condition(
        conditions, cond.SPEC_CHANGE_REFUSED, "True", "RestartRequired", message, now
    )
    return Refusal(effective, conditions, refused, events)
