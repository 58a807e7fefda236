"""The test world's API server rules, pure: the CRD's schema (pruning, defaulting, types, bounds, enums,
required fields, list-map keys, CEL with transition rules, ratcheting), Pod Security and ResourceQuota
admission, label selectors and RBAC over roles and bindings. Each rule is made to refuse, and the refusal
is checked in the API server's words."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.support.api_server import admission, schema, status
from tests.support.api_server.rbac import Authorizer, Request
from tests.support.api_server.selectors import field_selector, label_selector
from tests.support.paths import ROOT

CRD = yaml.safe_load((ROOT / "crds" / "rlhfjob.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
JOB = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "j"},
    "spec": {
        "model": {"tiny": {}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "data/train.jsonl"},
        "roles": {"rollout": {"replicas": 2}, "learner": {"replicas": 1}},
        "training": {"steps": 10, "batchSize": 2},
    },
}


def job(**spec_changes) -> dict:
    out = copy.deepcopy(JOB)
    for dotted, value in spec_changes.items():
        node = out["spec"]
        *parents, last = dotted.split("__")
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
    return out


def messages(errors) -> list[str]:
    return [str(e) for e in errors]


# ----------------------------------------------------------------------------------------- schema
def test_a_valid_job_is_stored_defaulted_and_pruned() -> None:
    body = job(algorithm__unknownKnob=3)
    stored, errors = schema.admit(body, SCHEMA)
    assert errors == []
    assert "unknownKnob" not in stored["spec"]["algorithm"]  # pruned, not refused
    assert stored["spec"]["training"]["learningRate"] == 1e-6  # defaulted from the schema
    assert stored["metadata"] == {"name": "j"}


def test_bounds_types_enums_and_required_fields_are_refused_in_the_api_servers_words() -> None:
    body = job(roles__rollout={"replicas": -1}, training__batchSize="eight", algorithm__name="nope")
    del body["spec"]["data"]
    _, errors = schema.admit(body, SCHEMA)
    said = messages(errors)
    assert (
        "spec.roles.rollout.replicas: Invalid value: -1: spec.roles.rollout.replicas in body should be "
        "greater than or equal to 0"
    ) in said
    assert any(
        m.startswith('spec.training.batchSize: Invalid value: "eight": ') and "must be of type integer" in m
        for m in said
    )
    assert any(
        m.startswith('spec.algorithm.name: Unsupported value: "nope": supported values: "') for m in said
    )
    assert "spec.data: Required value" in said
    refusal = status.invalid("RLHFJob", "dverl.io", "j", errors)
    assert refusal.code == 422 and refusal.reason == "Invalid"
    assert refusal.message.startswith('RLHFJob.dverl.io "j" is invalid: [')
    assert {c["field"] for c in refusal.details["causes"]} >= {"spec.data", "spec.roles.rollout.replicas"}


def test_the_crds_cel_rules_run_after_the_schema() -> None:
    pool = {"name": "a", "replicas": 1}
    body = job(roles__rollout={"replicas": 2, "nodePools": [pool, pool]})
    _, errors = schema.admit(body, SCHEMA)
    assert any(
        e.reason == "FieldValueDuplicate" and e.field == "spec.roles.rollout.nodePools[1]" for e in errors
    )
    cel_nodes = [n for n in _nodes(SCHEMA) if n.get("x-kubernetes-validations")]
    assert len(cel_nodes) >= 20


def _nodes(node):
    yield node
    for sub in (node.get("properties") or {}).values():
        yield from _nodes(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _nodes(node[key])


def test_some_cel_rule_of_the_crd_refuses_what_the_python_rules_refuse() -> None:
    # training.epochs and training.steps: the CRD's rule wants at most one of them.
    rules = [r for n in _nodes(SCHEMA) for r in n.get("x-kubernetes-validations", [])]
    assert rules
    errors = []
    for epochs_and_steps in ({"steps": 10, "epochs": 2, "batchSize": 2},):
        _, errors = schema.admit(job(training=epochs_and_steps), SCHEMA)
    refused = [e for e in errors if e.field.startswith("spec")]
    assert refused, "a job with both steps and epochs passed every CEL rule"
    assert all(": Invalid value: " in str(e) for e in refused)


TRANSITION = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {"model": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0}},
            "x-kubernetes-validations": [
                {"rule": "self.model == oldSelf.model", "message": "model is immutable"},
                {"rule": "self.replicas <= 10", "message": "replicas: at most 10"},
            ],
        }
    },
}


def test_transition_rules_run_only_on_update() -> None:
    old = {"spec": {"model": "a", "replicas": 1}}
    assert schema.admit({"spec": {"model": "b", "replicas": 1}}, TRANSITION)[1] == []  # a create
    _, errors = schema.admit({"spec": {"model": "b", "replicas": 1}}, TRANSITION, old=old)
    assert messages(errors) == ['spec: Invalid value: "object": model is immutable']
    assert schema.admit({"spec": {"model": "a", "replicas": 2}}, TRANSITION, old=old)[1] == []


def test_an_update_may_keep_an_invalid_value_it_did_not_touch_but_not_make_one() -> None:
    stored_before = {"spec": {"model": "a", "replicas": -1}}
    assert (
        schema.admit({"spec": {"model": "a", "replicas": -1}, "status": {}}, TRANSITION, old=stored_before)[1]
        == []
    )
    _, errors = schema.admit({"spec": {"model": "a", "replicas": -2}}, TRANSITION, old=stored_before)
    assert [e.field for e in errors] == ["spec.replicas"]


# -------------------------------------------------------------------------------------- admission
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def pod(name: str = "p", gpus: int = 0, cpu: str = "1", memory: str = "1Gi", secure: bool = True) -> dict:
    limits = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    sc = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }
    container = {"name": "c", "image": "i", "resources": {"limits": limits}}
    if secure:
        container["securityContext"] = sc
    return {"metadata": {"name": name}, "spec": {"containers": [container]}, "status": {"phase": "Running"}}


def test_pod_security_refuses_a_pod_only_where_the_namespace_enforces_it() -> None:
    assert admission.pod_security(pod(secure=False), {}) is None
    assert admission.pod_security(pod(), RESTRICTED) is None
    refusal = admission.pod_security(pod(secure=False), RESTRICTED)
    assert refusal is not None and (refusal.code, refusal.reason) == (403, "Forbidden")
    assert refusal.message.startswith('pods "p" is forbidden: violates PodSecurity "restricted:latest": ')
    assert "spec.containers[0].securityContext.allowPrivilegeEscalation" in refusal.message
    assert "spec.containers[0].securityContext.capabilities.drop" in refusal.message
    enforce = "pod-security.kubernetes.io/enforce"
    assert admission.pod_security(pod(secure=False), {enforce: "privileged"}) is None
    bad_label = admission.pod_security(pod(secure=False), {enforce: "no-such-level"})
    assert bad_label is not None and '"restricted:latest"' in bad_label.message  # fails closed


GPU_QUOTA = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2", "pods": "3"}}}


def test_a_quota_refuses_what_would_take_it_over_in_the_api_servers_words() -> None:
    assert admission.quota(pod("a", gpus=2), [GPU_QUOTA], []) is None
    refusal = admission.quota(pod("b", gpus=1), [GPU_QUOTA], [pod("a", gpus=2)])
    assert refusal is not None and refusal.code == 403
    assert refusal.message == (
        'pods "b" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    finished = {**pod("a", gpus=2), "status": {"phase": "Succeeded"}}
    assert admission.quota(pod("b", gpus=1), [GPU_QUOTA], [finished]) is None  # done pods free it
    crowded = [pod("x"), pod("y"), pod("z")]
    assert "exceeded quota: gpus, requested: pods=1, used: pods=3, limited: pods=3" in str(
        admission.quota(pod("w"), [GPU_QUOTA], crowded)
    )


def test_a_cpu_or_memory_quota_needs_the_pod_to_state_it() -> None:
    quota = {"metadata": {"name": "compute"}, "spec": {"hard": {"requests.cpu": "4", "limits.memory": "8Gi"}}}
    bare = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    refusal = admission.quota(bare, [quota], [])
    assert refusal is not None and "failed quota: compute: must specify" in refusal.message
    assert "exceeded quota: compute, requested: limits.memory=16Gi" in str(
        admission.quota(pod(memory="16Gi"), [quota], [])
    )


def test_pod_validation_wants_named_containers_with_images() -> None:
    bad = {"spec": {"containers": [{"name": "c"}, {"name": "c", "image": "i"}]}}
    assert messages(admission.pod_errors(bad)) == [
        "spec.containers[0].image: Required value",
        'spec.containers[1].name: Duplicate value: "c"',
    ]
    assert messages(admission.pod_errors({"spec": {}})) == ["spec.containers: Required value"]


# -------------------------------------------------------------------------------------- selectors
def test_label_and_field_selectors_match_as_the_api_server_does() -> None:
    labels = {"dverl.io/job": "a", "dverl.io/role": "rollout"}
    assert label_selector("dverl.io/job=a,dverl.io/role in (rollout,learner)")(labels)
    assert not label_selector("dverl.io/job!=a")(labels)
    assert label_selector("!missing,dverl.io/role")(labels)
    assert not label_selector("dverl.io/role notin (rollout)")(labels)
    assert field_selector("metadata.name=x")({"metadata": {"name": "x"}})
    assert not field_selector("metadata.name!=x")({"metadata": {"name": "x"}})


# -------------------------------------------------------------------------------------------- RBAC
SA = {"kind": "ServiceAccount", "name": "op", "namespace": "ops"}
USER = "system:serviceaccount:ops:op"
OBJECTS = (
    {"kind": "ClusterRole", "metadata": {"name": "jobs"}, "rules": [
        {"apiGroups": ["dverl.io"], "resources": ["rlhfjobs", "rlhfjobs/status"], "verbs": ["get", "patch"]},
    ]},
    {"kind": "RoleBinding", "metadata": {"name": "jobs", "namespace": "team"}, "subjects": [SA],
     "roleRef": {"kind": "ClusterRole", "name": "jobs"}},
    {"kind": "Role", "metadata": {"name": "id", "namespace": "ops"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["identity"], "verbs": ["get"]},
    ]},
    {"kind": "RoleBinding", "metadata": {"name": "id", "namespace": "ops"}, "subjects": [SA],
     "roleRef": {"kind": "Role", "name": "id"}},
)  # fmt: skip


def test_rbac_grants_only_where_and_what_the_bindings_say() -> None:
    rbac = Authorizer(OBJECTS)
    assert rbac.allows(Request(USER, "patch", "dverl.io", "rlhfjobs", "status", "team", "j"))
    assert not rbac.allows(Request(USER, "patch", "dverl.io", "rlhfjobs", "status", "other", "j"))
    assert not rbac.allows(Request(USER, "list", "dverl.io", "rlhfjobs", "", "team"))
    assert rbac.allows(Request(USER, "get", "", "secrets", "", "ops", "identity"))
    assert not rbac.allows(Request(USER, "get", "", "secrets", "", "ops", "someone-elses"))
    assert not rbac.allows(
        Request("system:serviceaccount:ops:other", "get", "dverl.io", "rlhfjobs", "", "team", "j")
    )


def test_a_refused_request_gets_the_api_servers_403() -> None:
    rbac = Authorizer(OBJECTS)
    with pytest.raises(status.Refusal) as caught:
        rbac.check(Request(USER, "create", "", "pods", "", "team", "p"))
    assert caught.value.code == 403 and caught.value.reason == "Forbidden"
    assert caught.value.message == (
        f'pods "p" is forbidden: User "{USER}" cannot create resource "pods" in API group "" '
        'in the namespace "team"'
    )
    with pytest.raises(status.Refusal) as caught:
        rbac.check(Request(USER, "list", "", "namespaces"))
    assert caught.value.message.endswith(
        'cannot list resource "namespaces" in API group "" at the cluster scope'
    )


def test_a_pod_update_may_change_only_what_the_api_server_lets_change() -> None:
    old = pod()
    old["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "other"
    new["spec"]["schedulingGates"] = []
    new["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    assert admission.pod_update_errors(old, new) == []
    for change in (
        lambda s: s["containers"][0].update(command=["sh"]),
        lambda s: s.update(serviceAccountName="admin"),
        lambda s: s["schedulingGates"].append({"name": "another"}),
    ):
        bad = copy.deepcopy(old)
        change(bad["spec"])
        (error,) = admission.pod_update_errors(old, bad)
        assert error.field == "spec" and "pod updates may not change fields other than" in error.message
