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
