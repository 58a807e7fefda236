"""A veRL config as Hydra would see it: its `defaults:` list composed from the config folder beside it, and
its `${...}` interpolations resolved, so a converter reads the values a run would use.

veRL's `ppo_trainer.yaml` holds little itself: the actor, rollout, model, data and critic sections come from
its `defaults:` list (`actor@actor_rollout_ref.actor: dp_actor` reads `actor/dp_actor.yaml` into
`actor_rollout_ref.actor`), and those files have defaults of their own. This module follows Hydra's rules for
what veRL uses: `group@package: option`, a bare `name` (a file of the same folder, same package), relative
`../group`, `_self_`'s place, nested lists; `optional` entries that are missing are skipped, other missing
ones are reported, never guessed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from decentralized_verl.convert.common import load_yaml

ReadText = Callable[[str], str | None]
"""A config file's text by its path relative to the config folder (None: no such file)."""


@dataclass
class Composed:
    config: dict[str, Any]
    read: list[str] = field(default_factory=list)
    """The files composed, relative to the config folder, in order."""
    missing: list[str] = field(default_factory=list)
    """Defaults entries whose file is not in the folder."""


def load_mapping(text: str, where: str) -> dict[str, Any]:
    loaded = load_yaml(text) if text.strip() else {}
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{where}: a config file is a YAML mapping")
    return loaded


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, mappings merged key by key (OmegaConf's merge)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _place(package: str, config: dict[str, Any]) -> dict[str, Any]:
    for part in reversed([p for p in package.split(".") if p]):
        config = {part: config}
    return config


def _join(parent: str, child: str) -> str:
    return ".".join(p for p in (parent, child) if p)


def _entry(item: Any) -> tuple[str, str | None, bool] | None:
    """(target, option, optional) of one defaults entry; None for `_self_`, for a group with no option
    chosen (`group: null`) and for Hydra's own groups (`hydra/...`, `override hydra/...`)."""
    if isinstance(item, str):
        return None if item == "_self_" or item.startswith("hydra/") else (item, None, False)
    if isinstance(item, dict) and len(item) == 1:
        ((key, option),) = item.items()
        key = str(key).strip()
        if option is None or key.removeprefix("override ").startswith("hydra/"):
            return None
        optional = key.startswith("optional ")
        key = key.removeprefix("optional ").removeprefix("override ").strip()
        return key, None if option is None else str(option), optional
    raise ValueError(f"defaults entry {item!r}: expected name, _self_ or group: option")


def compose(name: str, read: ReadText, primary: dict[str, Any] | None = None) -> Composed:
    """The config file `name` (relative to the config folder; `primary` when already read) with its
    defaults composed."""
    result = Composed(config={})
    result.config = _compose(name, "", read, result, depth=0, own=primary)
    return result


def _compose(
    name: str, package: str, read: ReadText, result: Composed, depth: int, own: dict[str, Any] | None = None
) -> dict[str, Any]:
    if depth > 20:
        raise ValueError(f"{name}: defaults nest more than 20 deep (a cycle?)")
    if own is None:
        text = read(name)
        if text is None:
            result.missing.append(name)
            return {}
        result.read.append(name)
        own = load_mapping(text, name)
    else:
        own = dict(own)
    defaults = own.pop("defaults", None) or []
    if not isinstance(defaults, list):
        raise ValueError(f"{name}: defaults must be a list")
    folder = str(PurePosixPath(name).parent)
    folder = "" if folder == "." else folder
    parts: list[dict[str, Any]] = []
    self_at = None
    for item in defaults:
        entry = _entry(item)
        if entry is None:
            if item == "_self_":
                self_at = len(parts)
            continue
        target, option, optional = entry
        group, _, at = target.partition("@")
        group_path = str(PurePosixPath(folder, group)) if folder else group
        group_path = _normalize(group_path)
        if option is None:  # a config file, not a group: same package unless `@` says
            file = f"{group_path}.yaml"
            child_package = _join(package, at) if at else package
        else:
            file = f"{group_path}/{option}.yaml"
            own_group = group.rsplit("/", 1)[-1]
            child_package = _join(package, at if at else own_group)
        if optional and read(file) is None:
            continue
        parts.append(_place(child_package, _compose(file, child_package, read, result, depth + 1)))
    own_placed = _place(package, own) if package else own
    parts.insert(len(parts) if self_at is None else self_at, own_placed)
    merged: dict[str, Any] = {}
    for part in parts:
        merged = merge(merged, part)
    return _under(merged, package)


def _under(config: dict[str, Any], package: str) -> dict[str, Any]:
    """The part of `config` at `package` (compose builds each file's subtree from the root down)."""
    node: Any = config
    for part in (p for p in package.split(".") if p):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def _normalize(path: str) -> str:
    out: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part and part != ".":
            out.append(part)
    return "/".join(out)


_WHOLE = re.compile(r"^\$\{([^${}]*)\}$")
_INNER = re.compile(r"\$\{([^${}]*)\}")


@dataclass
class Resolved:
    config: dict[str, Any]
    environment: dict[str, str] = field(default_factory=dict)
    """Keys whose value reads an environment variable (`${oc.env:NAME}`), and the variable."""
    unresolved: dict[str, str] = field(default_factory=dict)
    """Keys whose interpolation names nothing in the config, or a resolver this reader does not know."""


def resolve(config: dict[str, Any]) -> Resolved:
    """`${a.b}`, `${.sibling}` and `${oc.select:a.b,default}` replaced by the values they name;
    `${oc.env:NAME}` kept as written and listed."""
    out = Resolved(config=copy.deepcopy(config))
    for _ in range(10):
        changed = False

        def walk(node: dict[str, Any], where: list[str]) -> None:
            nonlocal changed
            for key, value in list(node.items()):
                path = [*where, str(key)]
                if isinstance(value, dict):
                    walk(value, path)
                elif isinstance(value, str) and "${" in value:
                    new = _interpolate(value, path, out)
                    if new is not value and new != value:
                        node[key] = new
                        changed = True

        walk(out.config, [])
        if not changed:
            break
    return out


_MISSING = object()


def _lookup(config: dict[str, Any], ref: str, where: list[str]) -> Any:
    if ref.startswith("."):
        dots = len(ref) - len(ref.lstrip("."))
        base = where[: len(where) - dots]
        parts = [*base, *ref.lstrip(".").split(".")]
    else:
        parts = ref.split(".")
    node: Any = config
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _interpolate(value: str, path: list[str], out: Resolved) -> Any:
    key = ".".join(path)

    def one(body: str) -> Any:
        body = body.strip()
        if body.startswith("oc.env:"):
            out.environment[key] = body.removeprefix("oc.env:").split(",", 1)[0].strip()
            return _MISSING
        if body.startswith("oc.select:"):
            ref, _, default = body.removeprefix("oc.select:").partition(",")
            found = _lookup(out.config, ref.strip(), path)
            if found is not _MISSING and found is not None and not _pending(found):
                return found
            if found is not _MISSING and _pending(found):
                return _MISSING
            return load_yaml(default) if default.strip() else None
        if ":" in body:  # another resolver (oc.create, custom ones)
            out.unresolved[key] = value
            return _MISSING
        found = _lookup(out.config, body, path)
        if found is _MISSING:
            out.unresolved[key] = value
        return _MISSING if found is _MISSING or _pending(found) else found

    whole = _WHOLE.match(value)
    if whole:
        found = one(whole.group(1))
        return value if found is _MISSING else found
    pieces: list[str] = []
    last = 0
    for match in _INNER.finditer(value):
        found = one(match.group(1))
        if found is _MISSING or isinstance(found, dict | list):
            return value
        pieces.append(value[last : match.start()] + ("" if found is None else str(found)))
        last = match.end()
    return "".join(pieces) + value[last:]


def _pending(value: Any) -> bool:
    return isinstance(value, str) and "${" in value
