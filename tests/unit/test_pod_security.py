"""Every pod the operator builds, for every shipped example, passes the Pod Security "restricted" profile,
checked by a checker of the standard's documented rules that is itself shown to refuse each kind of
violation; and the pod settings that follow from a role (/dev/shm, grace period, no API token) are right."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import load_job, parse_spec
from decentralized_verl.spec.pod_security import violations
from decentralized_verl.spec.source_paths import SHM_DIR
from dverl_operator.objects import owned
from dverl_operator.pods.security import (
    LEARNER_GRACE_UNKNOWN_S,
    SERVING_GRACE_S,
    WORKER_GID,
    WORKER_UID,
)
from dverl_operator.reconcile.desired import for_job
from tests.support.job_manifests import EXAMPLE_JOBS
from tests.support.operator_fixtures import tiny_spec


def build(spec: Any, name: str = "j") -> dict[str, dict[str, Any]]:
    plan = plan_job(spec, name)
    return for_job(owned.Owner(name, "ns", "uid"), spec, plan, "img:1", gateway_type="NodePort").pods


@pytest.mark.parametrize("example", EXAMPLE_JOBS, ids=lambda p: p.stem)
def test_every_pod_of_every_example_passes_restricted(example: Path) -> None:
    job = load_job(example)
    pods = build(job.spec, job.metadata.name)
    assert pods
    for name, pod in pods.items():
        assert violations(pod, "restricted") == [], name
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == WORKER_UID
        assert spec["securityContext"]["runAsGroup"] == WORKER_GID
        assert spec["terminationGracePeriodSeconds"] >= SERVING_GRACE_S
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
        assert {"name": "dshm", "mountPath": SHM_DIR} in spec["containers"][0]["volumeMounts"]


def test_pods_with_sources_and_templates_pass_restricted() -> None:
    spec = parse_spec(
        tiny_spec(
            model={"path": "/models/m"},
            sources=[
                {
                    "name": "m",
                    "mountPath": "/models",
                    "uri": {"url": "https://h/m.tar.gz", "insecureSkipDigest": True},
                },
                {"name": "d", "mountPath": "/data", "pvc": {"claimName": "c", "subPath": "toy"}},
            ],
            roles={
                "rollout": {"replicas": 1},
                "learner": {
                    "replicas": 1,
                    "podTemplate": {
                        "spec": {"initContainers": [{"name": "warm", "image": "b", "command": ["true"]}]}
                    },
                },
            },
        )
    )
    for name, pod in build(spec).items():
        assert violations(pod) == [], name
        assert len(pod["spec"].get("initContainers", [])) == (2 if "learner" in name else 1)


def good_pod() -> dict[str, Any]:
    return copy.deepcopy(build(parse_spec(tiny_spec()))["j-learner-0"])


def worker(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def csc(pod: dict[str, Any]) -> dict[str, Any]:
    """The worker container's security context."""
    return worker(pod)["securityContext"]


def psc(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's security context."""
    return pod["spec"]["securityContext"]


APPARMOR = "container.apparmor.security.beta.kubernetes.io/worker"


BREAKS = [
    ("baseline", "Host Namespaces", lambda p: p["spec"].update(hostNetwork=True)),
    ("baseline", "Host Namespaces", lambda p: p["spec"].update(hostPID=True)),
    ("baseline", "Host Namespaces", lambda p: p["spec"].update(hostIPC=True)),
    ("baseline", "HostProcess", lambda p: psc(p).update(windowsOptions={"hostProcess": True})),
    ("baseline", "Privileged Containers", lambda p: csc(p).update(privileged=True)),
    ("baseline", "Capabilities", lambda p: csc(p)["capabilities"].update(add=["SYS_ADMIN"])),
    ("baseline", "HostPath Volumes", lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {}})),
    ("baseline", "Host Ports", lambda p: worker(p)["ports"][0].update(hostPort=8080)),
    ("baseline", "AppArmor", lambda p: csc(p).update(appArmorProfile={"type": "Unconfined"})),
    ("baseline", "AppArmor", lambda p: p["metadata"]["annotations"].update({APPARMOR: "unconfined"})),
    ("baseline", "SELinux", lambda p: csc(p).update(seLinuxOptions={"type": "spc_t"})),
    ("baseline", "SELinux", lambda p: psc(p).update(seLinuxOptions={"user": "root"})),
    ("baseline", "/proc Mount Type", lambda p: csc(p).update(procMount="Unmasked")),
    ("baseline", "Seccomp", lambda p: psc(p).update(seccompProfile={"type": "Unconfined"})),
    ("baseline", "Sysctls", lambda p: psc(p).update(sysctls=[{"name": "kernel.msgmax"}])),
    ("restricted", "Volume Types", lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {}})),
    ("restricted", "Privilege Escalation", lambda p: csc(p).pop("allowPrivilegeEscalation")),
    ("restricted", "Running as Non-root", lambda p: csc(p).update(runAsNonRoot=False)),
    ("restricted", "Running as Non-root user", lambda p: csc(p).update(runAsUser=0)),
    ("restricted", "Running as Non-root user", lambda p: psc(p).update(runAsUser=0)),
    ("restricted", "Capabilities", lambda p: csc(p)["capabilities"].update(drop=["NET_RAW"])),
    ("restricted", "Capabilities", lambda p: csc(p)["capabilities"].update(add=["CHOWN"])),
]  # fmt: skip


@pytest.mark.parametrize(
    ("level", "rule", "change"), BREAKS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BREAKS)]
)
def test_the_checker_refuses_each_kind_of_violation(level: str, rule: str, change: Any) -> None:
    pod = good_pod()
    assert violations(pod) == []
    change(pod)
    found = violations(pod, "restricted")
    assert found and (found[0].rule, found[0].level) == (rule, level), found
    # (restricted names some baseline breaks again under its own rule: hostPath among Volume Types)
    assert {v.rule for v in found} <= {rule, "Volume Types"}, found
    if level == "restricted":
        assert violations(pod, "baseline") == []  # baseline allows it


def test_container_settings_may_come_from_the_pod_alone_but_not_from_nowhere() -> None:
    pod = good_pod()
    for key in ("runAsNonRoot", "seccompProfile"):
        worker(pod)["securityContext"].pop(key)
    assert violations(pod) == []  # the pod-level settings cover the container
    del pod["spec"]["securityContext"]["runAsNonRoot"]
    del pod["spec"]["securityContext"]["seccompProfile"]
    rules = sorted(v.rule for v in violations(pod))
    assert rules == ["Running as Non-root", "Seccomp"]
    init = {"name": "i", "image": "x", "securityContext": {"privileged": True}}
    pod = good_pod()
    pod["spec"]["initContainers"] = [init]
    assert {v.field.split(".")[1] for v in violations(pod)} == {"initContainers[0]"}


def test_shm_and_grace_follow_the_role() -> None:
    spec = parse_spec(
        tiny_spec(
            roles={
                "rollout": {"replicas": 1, "resources": {"memory": "16Gi"}},
                "learner": {"replicas": 1},
            }
        )
    )
    pods = build(spec)

    def shm(pod: dict[str, Any]) -> str:
        return next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]

    assert shm(pods["j-rollout-0"]) == "4096Mi"  # a quarter of the worker's memory
    assert shm(pods["j-learner-0"]) == "1Gi"  # no memory set
    assert pods["j-rollout-0"]["spec"]["terminationGracePeriodSeconds"] == SERVING_GRACE_S
    tiny_grace = pods["j-learner-0"]["spec"]["terminationGracePeriodSeconds"]
    assert SERVING_GRACE_S < tiny_grace < 120  # a tiny model's checkpoint is quick
    folder = parse_spec(tiny_spec(model={"path": "/models/unknown"}))
    assert build(folder)["j-learner-0"]["spec"]["terminationGracePeriodSeconds"] == LEARNER_GRACE_UNKNOWN_S
    off = parse_spec(tiny_spec(training={"steps": 2, "checkpoint": {"every": 0}}))
    assert build(off)["j-learner-0"]["spec"]["terminationGracePeriodSeconds"] == SERVING_GRACE_S
