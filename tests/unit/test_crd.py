"""The checked-in CRD is exactly `dverl crd`'s output, and it is a structural Kubernetes schema.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import yaml

from decentralized_verl.spec.crd import custom_resource_definition
from tests.support.paths import ROOT


def test_names_scope_and_subresources() -> None:
    crd = custom_resource_definition()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "rlhfjobs.dverl.io"
    assert spec["group"] == "dverl.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "RLHFJob" and spec["names"]["plural"] == "rlhfjobs"
    assert spec["names"]["shortNames"] == ["rlhf"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Phase",
        "Step",
        "Reward",
        "Workers",
        "Volunteers",
        "Blocked",
        "Refit",
        "Age",
        "Message",
    ]
    wide_only = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide_only == ["Blocked", "Refit"]  # `kubectl get rlhfjobs -o wide`


def _walk(node: dict, path: str, found: list[str]) -> None:
    if "type" not in node:
        found.append(f"{path}: no type")
    for bad in ("anyOf", "oneOf", "allOf", "$ref", "const", "title"):
        if bad in node:
            found.append(f"{path}: {bad}")
    if "properties" in node and "additionalProperties" in node:
        found.append(f"{path}: properties beside additionalProperties")
    for name, sub in node.get("properties", {}).items():
        _walk(sub, f"{path}.{name}", found)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", found)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", found)


def test_schema_is_structural_and_generated_from_spec() -> None:
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: list[str] = []
    _walk(schema, "", found)
    assert found == []
    spec = schema["properties"]["spec"]
    # Fields and constraints come from the pydantic model, camelCase.
    rollout = spec["properties"]["roles"]["properties"]["rollout"]["properties"]
    assert rollout["replicas"]["minimum"] == 0
    assert rollout["backend"]["enum"] == ["hf", "vllm"]
    assert set(spec["required"]) == {"model", "algorithm", "data"}
    sample = spec["properties"]["algorithm"]["properties"]["samplesPerPrompt"]
    assert sample["minimum"] == 0 and sample["exclusiveMinimum"] is True
    assert spec["properties"]["roles"]["properties"]["critic"]["nullable"] is True
    status = schema["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Queued", "Running", "Succeeded", "Failed", "Suspended"]


def test_crd_validates_against_kubernetes_schema() -> None:
    import kubernetes_validate

    crd = yaml.safe_load((ROOT / "crds" / "rlhfjob.yaml").read_text())
    kubernetes_validate.validate(crd, "1.30", strict=True)


def test_every_name_valued_field_lists_its_registry_names() -> None:
    import re

    from decentralized_verl.spec.catalogue import algorithms as catalogue
    from decentralized_verl.spec.catalogue.algorithms import PRESETS
    from decentralized_verl.spec.catalogue.backends import BACKEND_KINDS
    from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES

    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    algorithm = spec["properties"]["algorithm"]["properties"]
    assert algorithm["name"]["enum"] == list(PRESETS)
    assert algorithm["advantageEstimator"]["enum"] == list(catalogue.ADVANTAGE_ESTIMATOR_NAMES)
    assert algorithm["policyLoss"]["enum"] == list(catalogue.POLICY_LOSS_NAMES)
    assert algorithm["lossAggregation"]["enum"] == list(catalogue.LOSS_AGGREGATION_NAMES)
    assert algorithm["klEstimator"]["enum"] == list(catalogue.KL_ESTIMATOR_NAMES)
    for role in ("rollout", "learner", "critic", "reward", "reference"):
        backend = spec["properties"]["roles"]["properties"][role]["properties"]["backend"]
        assert backend["enum"] == list(BACKEND_KINDS)
    # A reward type is a built-in name or a user callable: one pattern accepts exactly those.
    reward = spec["properties"]["data"]["properties"]["rewardType"]
    for ok in (*BUILTIN_REWARD_TYPES, "my.module:score", "m:f"):
        assert re.match(reward["pattern"], ok), ok
    for bad in ("vibes", "boxedx", "module:", ":f", "a b:c"):
        assert not re.match(reward["pattern"], bad), bad
    assert all(name in reward["description"] for name in BUILTIN_REWARD_TYPES)
