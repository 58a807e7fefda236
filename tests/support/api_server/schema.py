"""A CRD's structural schema applied as the API server applies it to a create or update: unknown fields
pruned (unless x-kubernetes-preserve-unknown-fields), defaults filled, then the value validated (types,
enums, bounds, patterns, required fields, list-map keys) and the CEL rules (x-kubernetes-validations)
run on every node that carries them, transition rules (those naming `oldSelf`) only on an update where the
node existed before. On an update, errors on fields the update left unchanged are dropped (validation
ratcheting). Every error is a `FieldError` worded as the API server words it.

No API server runs here, so CEL runs in cel-python, with the object typed as the API server's CEL sees it:
`number` is a double, `integer` an int, and CEL keywords among property names escaped (`package` ->
`__package__`).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import celpy

CEL_KEYWORDS = {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function"}
CEL_KEYWORDS |= {"if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}
ENV = celpy.Environment()
PYTHON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422: the field path, the cause's reason and the API server's sentence."""

    field: str
    reason: str
    """FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueDuplicate, ..."""
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _shown(value: Any) -> str:
    """A value as the API server quotes it in an error (Go's %v of the JSON value)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if value is None:
        return "null"
    return str(value)


# --------------------------------------------------------------------------------- pruning, defaults
def _sub(node: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of `key` inside an object node (None: the key is unknown there)."""
    props = node.get("properties") or {}
    if key in props:
        return props[key]
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    if extra is True or node.get("x-kubernetes-preserve-unknown-fields"):
        return {}
    return None


def prune(value: Any, node: dict[str, Any]) -> Any:
    """Drop every field the schema does not name, as a structural schema's pruning does."""
    if isinstance(value, dict) and node.get("type", "object") == "object":
        if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
            return copy.deepcopy(value)
        out = {}
        for key, item in value.items():
            sub = _sub(node, key)
            if sub is not None:
                out[key] = prune(item, sub)
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [prune(v, node["items"]) for v in value]
    return copy.deepcopy(value)


def with_defaults(value: Any, node: dict[str, Any]) -> Any:
    """Structural defaulting: a missing property with a default gets it, then its own members theirs."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
        for name in value:
            if name in node["properties"]:
                value[name] = with_defaults(value[name], node["properties"][name])
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        value = {k: with_defaults(v, node["additionalProperties"]) for k, v in value.items()}
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        value = [with_defaults(v, node["items"]) for v in value]
    return value


# ------------------------------------------------------------------------------------ validation
def validate(value: Any, node: dict[str, Any], path: str) -> list[FieldError]:
    """Every way `value` breaks the OpenAPI v3 parts of `node` (what the CRD's schema uses)."""
    if value is None:
        if node.get("nullable"):
            return []
        return [
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f'Invalid value: "null": {path} in body must be of type {node.get("type", "object")}: "null"',
            )
        ]
    kind = node.get("type")
    if kind and (
        not isinstance(value, PYTHON_TYPES[kind])
        or (kind in ("integer", "number") and isinstance(value, bool))
        or (kind == "integer" and isinstance(value, float) and not value.is_integer())
    ):
        got = {str: "string", bool: "boolean", dict: "object", list: "array", float: "number", int: "integer"}
        return [
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {_shown(value)}: {path} in body must be of type {kind}: "
                f'"{got.get(type(value), type(value).__name__)}"',
            )
        ]
    errors: list[FieldError] = []

    def invalid(detail: str) -> None:
        errors.append(FieldError(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {detail}"))

    if "enum" in node and value not in node["enum"]:
        supported = ", ".join(_shown(v) for v in node["enum"])
        errors.append(
            FieldError(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {_shown(value)}: supported values: {supported}",
            )
        )
    if kind in ("integer", "number"):
        low, high = node.get("minimum"), node.get("maximum")
        if low is not None and (value <= low if node.get("exclusiveMinimum") else value < low):
            word = "greater than" if node.get("exclusiveMinimum") else "greater than or equal to"
            invalid(f"{path} in body should be {word} {low}")
        if high is not None and (value >= high if node.get("exclusiveMaximum") else value > high):
            word = "less than" if node.get("exclusiveMaximum") else "less than or equal to"
            invalid(f"{path} in body should be {word} {high}")
    if kind == "string":
        if "minLength" in node and len(value) < node["minLength"]:
            invalid(f"{path} in body should be at least {node['minLength']} chars long")
        if "maxLength" in node and len(value) > node["maxLength"]:
            errors.append(
                FieldError(
                    path, "FieldValueTooLong", f"Too long: may not be more than {node['maxLength']} bytes"
                )
            )
        if "pattern" in node and not re.search(node["pattern"], value):
            invalid(f"{path} in body should match '{node['pattern']}'")
    if kind == "array":
        if "minItems" in node and len(value) < node["minItems"]:
            invalid(f"{path} in body should have at least {node['minItems']} items")
        if "maxItems" in node and len(value) > node["maxItems"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {node['maxItems']} items",
                )
            )
        items = node.get("items") if isinstance(node.get("items"), dict) else {}
        for i, item in enumerate(value):
            errors += validate(item, items, f"{path}[{i}]")
        if node.get("x-kubernetes-list-type") == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            seen: set[str] = set()
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    key = json.dumps({k: item.get(k) for k in keys}, sort_keys=True)
                    if key in seen:
                        shown = ", ".join(f'"{k}":{json.dumps(item.get(k))}' for k in keys)
                        errors.append(
                            FieldError(
                                f"{path}[{i}]",
                                "FieldValueDuplicate",
                                f"Duplicate value: map[string]interface {{}}{{{shown}}}",
                            )
                        )
                    seen.add(key)
        elif node.get("x-kubernetes-list-type") == "set":
            for i, item in enumerate(value):
                if item in value[:i]:
                    errors.append(
                        FieldError(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {_shown(item)}")
                    )
    if kind == "object" or isinstance(value, dict):
        for name in node.get("required") or []:
            if name not in value:
                errors.append(FieldError(f"{path}.{name}", "FieldValueRequired", "Required value"))
        for key, item in value.items():
            sub = _sub(node, key)
            if sub is not None:
                errors += validate(item, sub, f"{path}.{key}")
    return errors


# ------------------------------------------------------------------------------------------ CEL
def to_cel(value: Any, node: dict[str, Any]) -> Any:
    """The object as CEL sees it: schema-typed numbers, keyword property names escaped."""
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties") if isinstance(node.get("additionalProperties"), dict) else {}
        out = {}
        for key, item in value.items():
            name = f"__{key}__" if key in CEL_KEYWORDS and props else key
            out[name] = to_cel(item, props.get(key, extra))
        return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in out.items()})
    if isinstance(value, list):
        return celpy.celtypes.ListType([to_cel(v, node.get("items", {})) for v in value])
    if node.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return celpy.celtypes.DoubleType(float(value))
    return celpy.json_to_cel(value)


@functools.cache
def program(rule: str) -> celpy.Runner:
    return ENV.program(ENV.compile(rule))


class RuleError(AssertionError):
    """A rule that could not be evaluated: a bug in the rule, not a refusal."""


def _is_true(result: Any) -> bool:
    return result is True or result == celpy.celtypes.BoolType(True)


def cel_refusals(
    value: Any, node: dict[str, Any], path: str, old: Any = None, has_old: bool = False
) -> list[FieldError]:
    """The CEL rules `value` (already defaulted) breaks, as the API server reports them. Transition rules
    (naming `oldSelf`) run only where the node had an old value (an update); `old` is that value."""
    found: list[FieldError] = []
    if value is None:
        return found
    for rule in node.get("x-kubernetes-validations", []):
        transition = re.search(r"\boldSelf\b", rule["rule"]) is not None
        if transition and not has_old:
            continue
        bindings = {"self": to_cel(value, node)}
        if transition:
            bindings["oldSelf"] = to_cel(old, node)
        try:
            ok = program(rule["rule"]).evaluate(bindings)
        except Exception as exc:
            raise RuleError(f"{path}: {rule['rule']}: {exc}") from exc
        if isinstance(ok, celpy.CELEvalError):
            raise RuleError(f"{path}: {rule['rule']}: {ok}")
        if not _is_true(ok):
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            shown = (
                '"object"'
                if isinstance(value, dict)
                else '"array"'
                if isinstance(value, list)
                else _shown(value)
            )
            found.append(FieldError(path, "FieldValueInvalid", f"Invalid value: {shown}: {message}"))
    if isinstance(value, dict):
        for key, item in value.items():
            sub = _sub(node, key)
            if sub is not None:
                was = old.get(key) if isinstance(old, dict) else None
                child_old = isinstance(old, dict) and key in old
                found += cel_refusals(item, sub, f"{path}.{key}", was, child_old)
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        keys = node.get("x-kubernetes-list-map-keys") or []
        for i, item in enumerate(value):
            was, child_old = None, False
            keyed = node.get("x-kubernetes-list-type") == "map" and isinstance(item, dict)
            if isinstance(old, list) and keyed:
                match = [o for o in old if isinstance(o, dict) and all(o.get(k) == item.get(k) for k in keys)]
                was, child_old = (match[0], True) if match else (None, False)
            found += cel_refusals(item, node["items"], f"{path}[{i}]", was, child_old)
    return found


# ------------------------------------------------------------------------------------ the whole
def admit(
    obj: dict[str, Any], schema: dict[str, Any], old: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[FieldError]]:
    """`obj` pruned and defaulted as it would be stored, and every error the API server would report for
    it (empty: it is stored). `metadata` is the API server's own and passes through untouched."""
    metadata = obj.get("metadata")
    body = {k: v for k, v in obj.items() if k != "metadata"}
    stored = with_defaults(prune(body, schema), schema)
    errors: list[FieldError] = []
    for key in schema.get("required") or []:
        if key not in stored:
            errors.append(FieldError(key, "FieldValueRequired", "Required value"))
    # A section an update left exactly as it was cannot add an error ratcheting would keep: skip it.
    changed = {
        key: item
        for key, item in stored.items()
        if key not in ("apiVersion", "kind") and _sub(schema, key) is not None
        and (old is None or key not in old or old[key] != item)
    }  # fmt: skip
    for key, item in changed.items():
        errors += validate(item, _sub(schema, key) or {}, key)
    if not errors:
        for key, item in changed.items():
            was = (old or {}).get(key)
            errors += cel_refusals(item, _sub(schema, key) or {}, key, was, old is not None and key in old)
    if old is not None:  # ratcheting: what the update left as it was may stay as it was
        errors = [e for e in errors if not _unchanged(e.field, stored, old)]
    if metadata is not None:
        stored["metadata"] = metadata
    return stored, errors


_MISSING = object()


def _at(obj: Any, path: str) -> Any:
    node = obj
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        if index:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else _MISSING
        else:
            node = node.get(name, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _unchanged(path: str, new: Any, old: Any) -> bool:
    """The field at `path` holds the same value before and after an update (validation ratcheting, on by
    default since Kubernetes 1.30: an update may keep an invalid value it did not touch)."""
    before = _at(old, path)
    return before is not _MISSING and before == _at(new, path)
