"""A role's podTemplate cannot step outside Pod Security "restricted": `dverl validate` (and so the
operator, which parses the same spec) names each field that would, the operator checks every merged pod
again before creating any, and a serviceAccountName is allowed only from the operator's list."""

from __future__ import annotations

from typing import Any

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.reconcile.settings import Settings
from dverl_operator.status import conditions as cond
from tests.support.cluster_world import World
from tests.support.operator_fixtures import tiny_spec

WHERE = "spec.roles.rollout.podTemplate"


def with_template(template: dict[str, Any]) -> dict[str, Any]:
    spec = tiny_spec()
    spec["roles"]["rollout"]["podTemplate"] = template
    return spec


def problems(template: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        parse_spec(with_template(template))
    return {p.path: p.message for p in caught.value.problems}


def init(**security: Any) -> dict[str, Any]:
    return {"spec": {"initContainers": [{"name": "setup", "image": "busybox", "securityContext": security}]}}


@pytest.mark.parametrize(
    ("template", "field", "says"),
    [
        (init(privileged=True), "spec.initContainers[0].securityContext.privileged", "Privileged Containers"),
        (init(runAsUser=0), "spec.initContainers[0].securityContext.runAsUser", "must not be 0"),
        (init(runAsNonRoot=False), "spec.initContainers[0].securityContext.runAsNonRoot", "Non-root"),
        (
            init(capabilities={"add": ["SYS_ADMIN"], "drop": ["ALL"]}),
            "spec.initContainers[0].securityContext.capabilities.add",
            "SYS_ADMIN",
        ),
        (
            init(seccompProfile={"type": "Unconfined"}),
            "spec.initContainers[0].securityContext.seccompProfile.type",
            "'Unconfined' is not RuntimeDefault or Localhost",
        ),
        (
            init(allowPrivilegeEscalation=True),
            "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
            "must be false",
        ),
        (
            {"spec": {"volumes": [{"name": "share", "nfs": {"server": "n", "path": "/"}}]}},
            "spec.volumes[0]",
            "nfs",
        ),
        (
            {
                "metadata": {
                    "annotations": {"container.apparmor.security.beta.kubernetes.io/setup": "unconfined"}
                }
            },
            "metadata.annotations['container.apparmor.security.beta.kubernetes.io/setup']",
            "AppArmor",
        ),
    ],
)
def test_each_way_out_of_the_profile_is_refused_naming_the_field(template, field, says) -> None:
    found = problems(template)
    assert f"{WHERE}.{field}" in found, found
    assert says in found[f"{WHERE}.{field}"] or says in found[f"{WHERE}.{field}"].replace('"', "'")


def test_a_template_within_the_profile_passes() -> None:
    template = {
        "metadata": {
            "annotations": {"container.apparmor.security.beta.kubernetes.io/setup": "runtime/default"}
        },
        "spec": {
            "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "initContainers": [{"name": "setup", "image": "busybox", "securityContext": {"runAsUser": 1000}}],
        },
    }
    parse_spec(with_template(template))


def test_a_hostpath_is_named_once_with_what_to_use_instead() -> None:
    found = problems({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}})
    assert (
        list(found) == [f"{WHERE}.spec.volumes[0].hostPath"]
        and "use a PVC" in found[f"{WHERE}.spec.volumes[0].hostPath"]
    )


def accounts(*names: str) -> Settings:
    return Settings(service_accounts=frozenset(names))


def test_a_service_account_off_the_operators_list_is_refused_by_field() -> None:
    world = World(
        with_template({"spec": {"serviceAccountName": "cluster-admin-sa"}}), settings=accounts("reader")
    )
    world.step()
    assert world.status["phase"] == "Failed" and world.pods == {}
    failed = cond.condition(world.status["conditions"], cond.VALIDATION_FAILED)
    assert failed is not None
    assert failed["message"] == (
        f"{WHERE}.spec.serviceAccountName: 'cluster-admin-sa' is not one this operator may give pods "
        "(allowed: reader; the chart's podTemplate.serviceAccountNames)"
    )
    nothing = World(with_template({"spec": {"serviceAccountName": "reader"}}))
    nothing.step()
    assert "(allowed: none;" in nothing.status["message"]


def test_a_listed_service_account_is_given_to_the_pods() -> None:
    world = World(with_template({"spec": {"serviceAccountName": "reader"}}), settings=accounts("reader"))
    world.settle()
    assert world.pods["j-rollout-0"]["spec"]["serviceAccountName"] == "reader"
    assert "serviceAccountName" not in world.pods["j-learner-0"]["spec"]


def test_the_operator_checks_the_merged_pods_before_creating_any(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod the operator would build outside the profile (here: a template whose init container the
    spec rules let through, made privileged after parsing, as a newer operator's template could) is
    refused whole: no pod of the job is created."""
    from dverl_operator.reconcile import decide as decide_module

    original = decide_module.parse_spec

    def loosened(spec: Any) -> Any:
        parsed = original(spec)
        template = parsed.roles.rollout.pod_template
        template.spec.init_containers[0]["securityContext"] = {"privileged": True}
        return parsed

    world = World(with_template(init(runAsUser=1000)))
    monkeypatch.setattr(decide_module, "parse_spec", loosened)
    world.step()
    assert world.pods == {} and world.status["phase"] == "Failed"
    assert "pod j-rollout-0: spec.initContainers[" in world.status["message"]
    assert "outside Pod Security restricted: Privileged Containers" in world.status["message"]


def at_level(level: str | None, template: dict[str, Any]) -> dict[str, Any]:
    spec = with_template(template)
    if level is not None:
        spec["podSecurity"] = level
    return spec


def level_problems(level: str | None, template: dict[str, Any]) -> dict[str, str]:
    try:
        parse_spec(at_level(level, template))
    except ManifestError as caught:
        return {p.path: p.message for p in caught.problems}
    return {}


CHOWN_AS_ROOT = init(runAsUser=0, capabilities={"add": ["CHOWN"]})
PRIVILEGED = init(privileged=True)
HOST_PATH = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/srv"}}]}}


@pytest.mark.parametrize(
    ("template", "refused_at", "admitted_at"),
    [
        (CHOWN_AS_ROOT, ("restricted",), ("baseline", "privileged")),
        (PRIVILEGED, ("restricted", "baseline"), ("privileged",)),
        (HOST_PATH, ("restricted", "baseline"), ("privileged",)),
    ],
)
def test_a_template_is_judged_at_the_level_the_job_declares(template, refused_at, admitted_at) -> None:
    """Root with a default capability is baseline, a privileged init container or a hostPath only
    privileged; each is refused below its level, by field and naming the level, and passes at it."""
    for level in refused_at:
        found = level_problems(level, template)
        assert found, level
        assert all(f"Pod Security {level}" in m for m in found.values()), found
    for level in admitted_at:
        assert level_problems(level, template) == {}, level
    assert level_problems(None, template) == level_problems("restricted", template)


def test_an_unknown_level_is_refused_by_field() -> None:
    found = level_problems("root", {"spec": {}})
    assert list(found) == ["spec.podSecurity"], found
    assert "restricted" in found["spec.podSecurity"] and "privileged" in found["spec.podSecurity"]


ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.mark.parametrize(
    ("label", "level", "enforced"),
    [
        ("restricted", "baseline", "restricted"),
        ("restricted", "privileged", "restricted"),
        ("baseline", "privileged", "baseline"),
        ("no-such-level", "baseline", "restricted"),  # a bad label fails closed, as admission does
    ],
)
def test_a_job_declaring_more_than_its_namespace_admits_is_refused_before_any_pod(label, level, enforced):
    world = World(at_level(level, {"spec": {}}), namespace_labels={ENFORCE: label, "team": "rl"})
    world.step()
    assert world.pods == {} and world.status["phase"] == "Failed"
    message = (
        f"spec.podSecurity: {level!r} is more than namespace 'ns' admits: its label "
        f"{ENFORCE}={label} enforces {enforced}"
    )
    failed = cond.condition(world.status["conditions"], cond.VALIDATION_FAILED)
    assert failed is not None and failed["message"] == message
    assert ("Warning", cond.VALIDATION_FAILED, message) in world.events


@pytest.mark.parametrize(
    ("labels", "level"),
    [
        ({}, "privileged"),
        ({ENFORCE: "privileged"}, "privileged"),
        ({ENFORCE: "baseline"}, "baseline"),
        ({ENFORCE: "privileged"}, "restricted"),
        ({ENFORCE: "restricted"}, "restricted"),
        ({ENFORCE: "no-such-level"}, "restricted"),
    ],
)
def test_a_job_within_its_namespaces_level_gets_its_pods(labels, level) -> None:
    world = World(at_level(level, CHOWN_AS_ROOT if level != "restricted" else {"spec": {}}))
    world.namespace_labels = labels
    world.settle()
    assert {"j-learner-0", "j-rollout-0"} <= set(world.pods), world.status
    assert world.status.get("phase") != "Failed"


def test_the_merged_pods_are_checked_at_the_declared_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """A merged pod beyond the declared level is refused whole, naming that level; at a level that
    admits it, the same pod is made."""
    from dverl_operator.reconcile import decide as decide_module

    original = decide_module.parse_spec

    def loosened(spec: Any) -> Any:
        parsed = original(spec)
        parsed.roles.rollout.pod_template.spec.init_containers[0]["securityContext"] = {"privileged": True}
        return parsed

    monkeypatch.setattr(decide_module, "parse_spec", loosened)
    refused = World(at_level("baseline", CHOWN_AS_ROOT))
    refused.step()
    assert (
        refused.pods == {}
        and "outside Pod Security baseline: Privileged Containers" in refused.status["message"]
    )
    admitted = World(at_level("privileged", CHOWN_AS_ROOT))
    admitted.settle()
    assert "j-rollout-0" in admitted.pods
    assert admitted.pods["j-rollout-0"]["spec"]["initContainers"][-1]["securityContext"]["privileged"] is True
