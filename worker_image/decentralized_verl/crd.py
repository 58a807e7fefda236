"""Generate the RLHFJob CustomResourceDefinition from the pydantic spec (never written by hand).

Pydantic emits JSON Schema with $refs, anyOf-null and titles; Kubernetes wants a structural OpenAPI v3
schema: everything inlined, a type on every node, `nullable` instead of null unions, no `additionalProperties`
beside `properties`. This module does that translation, purely.
"""

from __future__ import annotations

from typing import Any

import yaml

from decentralized_verl.spec import API_GROUP, API_VERSION, KIND, PLURAL, SHORT_NAME, JobSpec, RLHFJobStatus

_DROP = {"title", "default", "examples"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [opt for opt in node["anyOf"] if opt.get("type") != "null"]
        nullable = len(options) != len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            out = _structural({**options[0], **rest}, defs)
        else:
            raise ValueError(f"union types are not structural: {node}")
        if nullable:
            out["nullable"] = True
        return out
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "const":
            out["enum"] = [value]
            out.setdefault("type", "string" if isinstance(value, str) else "number")
        elif key == "properties":
            out["properties"] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020 writes the bound itself; OpenAPI v3.0 wants the bound plus a flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties":
            # Structural schemas forbid additionalProperties beside properties; the API server prunes
            # unknown fields and the operator's pydantic validation names them.
            if isinstance(value, dict):
                out["additionalProperties"] = _structural(value, defs)
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def openapi_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


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
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition() -> dict[str, Any]:
    spec_schema = openapi_schema(JobSpec)
    status_schema = openapi_schema(RLHFJobStatus)
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
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `dverl crd` from decentralized_verl/spec/. Do not edit by hand.\n"
    return header + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100)
