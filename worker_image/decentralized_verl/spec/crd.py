"""Generate the RLHFJob CustomResourceDefinition from the pydantic spec (never written by hand).

Pydantic emits JSON Schema with $refs, anyOf-null and titles; Kubernetes wants a structural OpenAPI v3
schema: everything inlined, a type on every node, `nullable` instead of null unions, no `additionalProperties`
beside `properties`. This module does that translation, purely. What `kubectl explain` and the API server
use survives it: every field's description (the spec models' field docstrings), the spec's defaults (a
section made by a default factory defaults to `{}`, which the API server then fills from its own members'
defaults) and the CEL rules of spec/cel.py as `x-kubernetes-validations` on the node of their model.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from decentralized_verl.spec.cel import CEL_RULES
from decentralized_verl.spec.job import API_GROUP, API_VERSION, KIND, PLURAL, SHORT_NAME, JobSpec
from decentralized_verl.spec.status import RLHFJobStatus

_DROP = {"title", "examples"}

LIST_MAP_KEYS: dict[tuple[str, str], list[str]] = {("RoleSpec", "nodePools"): ["name"]}
"""(model, list field) -> the item fields that identify an item: the API server refuses two items with
the same key (a duplicate pool name) and server-side apply merges such lists item by item."""


class _WithFactoryDefaults(GenerateJsonSchema):
    """Defaults made by a factory appear too: a list or map as itself, a spec section as `{}` (its
    members' own defaults fill it in), so the API server stores what the operator will assume."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        made = factory()
        return {} if isinstance(made, BaseModel) else made


def _structural(node: Any, defs: dict[str, Any], model: str | None = None, defaults: bool = True) -> Any:
    """`model`: the pydantic model `node` was generated from (its CEL rules go on it); `defaults`: keep
    `default`s (the operator-written status keeps none: a default there would hide a missing write)."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs, name, defaults)
    if "anyOf" in node:
        options = [opt for opt in node["anyOf"] if opt.get("type") != "null"]
        nullable = len(options) != len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            out = _structural({**options[0], **rest}, defs, model, defaults)
        else:
            raise ValueError(f"union types are not structural: {node}")
        if nullable:
            out["nullable"] = True
        return out
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "default" and (value is None or not defaults):
            continue
        if key == "const":
            out["enum"] = [value]
            out.setdefault("type", "string" if isinstance(value, str) else "number")
        elif key == "properties":
            out["properties"] = {name: _structural(sub, defs, None, defaults) for name, sub in value.items()}
            for name, prop in out["properties"].items():
                if (model, name) in LIST_MAP_KEYS:
                    prop["x-kubernetes-list-type"] = "map"
                    prop["x-kubernetes-list-map-keys"] = LIST_MAP_KEYS[(model, name)]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020 writes the bound itself; OpenAPI v3.0 wants the bound plus a flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "items":
            out["items"] = _structural(value, defs, None, defaults)
        elif key == "additionalProperties":
            # Structural schemas forbid additionalProperties beside properties; the API server prunes
            # unknown fields and the operator's pydantic validation names them.
            if isinstance(value, dict):
                out["additionalProperties"] = _structural(value, defs, None, defaults)
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
    if model in CEL_RULES:
        out["x-kubernetes-validations"] = [rule.to_schema() for rule in CEL_RULES[model]]
    return out


def openapi_schema(model: type[BaseModel], defaults: bool = True) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults)
    return _structural(raw, raw.get("$defs", {}), model.__name__, defaults)


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.reward"},
    {"name": "Workers", "type": "string", "jsonPath": ".status.workers", "description": "ready/desired"},
    {"name": "Volunteers", "type": "integer", "jsonPath": ".status.volunteers"},
    {
        "name": "Blocked",
        "type": "integer",
        "jsonPath": ".status.blockedPeers",
        "description": "volunteers blocked by verification",
        "priority": 1,
    },
    {
        "name": "Refit",
        "type": "number",
        "jsonPath": ".status.refitParity.meanAbsDiff",
        "description": "rollout vs learner log-probs after the last refresh: mean absolute difference",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "description": "why the job is in its phase: a refused create, a failure, a queue",
    },
]


def custom_resource_definition() -> dict[str, Any]:
    spec_schema = openapi_schema(JobSpec)
    status_schema = openapi_schema(RLHFJobStatus, defaults=False)
    spec_schema["description"] = "What to train, with which algorithm, data, roles and node pools."
    status_schema["description"] = "Written by the operator only."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["all", "dverl"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An RL fine-tuning job for a language model.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": f"{API_GROUP}/{API_VERSION}",
                                },
                                "kind": {"type": "string", "description": KIND},
                                "metadata": {
                                    "type": "object",
                                    "description": "Standard object metadata; metadata.name is at most "
                                    "40 characters (pods are named <name>-<role>-<index>).",
                                },
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Each default list written out where it applies, never as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    header = "# Generated by `dverl crd` from decentralized_verl/spec/. Do not edit by hand.\n"
    return header + yaml.dump(custom_resource_definition(), Dumper=_NoAliases, sort_keys=False, width=100)
