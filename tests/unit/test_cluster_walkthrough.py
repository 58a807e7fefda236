"""docs/cluster.md holds together without a cluster: the objects it applies are valid Kubernetes objects
(checked against Kubernetes' own schemas), the loader pod passes the Pod Security "restricted" profile, the
job's claims and mount paths are the ones the volumes and the loader provide, and every file, chart value and
pod name the walk-through names exists. (Running it needs a real cluster; the page says so.)
"""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec import JobSpec
from tests.support.paths import ROOT

DOC = (ROOT / "docs" / "cluster.md").read_text()
CLUSTER = ROOT / "examples" / "cluster"
JOB = yaml.safe_load((ROOT / "examples" / "tiny-grpo-cluster.yaml").read_text())


def _objects(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CLUSTER / name).read_text()) if d]


@pytest.mark.parametrize("name", sorted(p.name for p in CLUSTER.glob("*.yaml")))
def test_objects_match_kubernetes_schemas(name: str) -> None:
    for obj in _objects(name):
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def restricted_violations(pod: dict) -> list[str]:
    """The Pod Security "restricted" profile's rules (kubernetes.io/docs/concepts/security/
    pod-security-standards), for the fields a pod like the loader can set."""
    spec = pod["spec"]
    pod_ctx = spec.get("securityContext", {})
    found = []
    for volume in spec.get("volumes", []):
        allowed = {"name", "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral"}
        allowed |= {"persistentVolumeClaim", "projected", "secret"}
        if set(volume) - allowed:
            found.append(f"volume {volume['name']}: {sorted(set(volume) - allowed)} not allowed")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        found.append("host namespaces")
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        ctx = c.get("securityContext", {})
        where = f"container {c['name']}"
        if ctx.get("privileged"):
            found.append(f"{where}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in ctx.get("capabilities", {}).get("drop", []):
            found.append(f"{where}: capabilities must drop ALL")
        if set(ctx.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: adds capabilities")
        if not (ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))):
            found.append(f"{where}: runAsNonRoot must be true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"{where}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{where}: hostPort")
    return found


def test_loader_pod_passes_the_restricted_profile() -> None:
    (pod,) = _objects("loader.yaml")
    assert restricted_violations(pod) == []
    # The checker itself refuses what the profile refuses.
    bad = yaml.safe_load(yaml.safe_dump(pod))
    bad["spec"]["securityContext"].pop("seccompProfile")
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    bad["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(restricted_violations(bad)) == 5


def test_the_job_reads_and_writes_the_claims_the_walkthrough_makes() -> None:
    claims = {obj["metadata"]["name"] for obj in _objects("volumes.yaml")}
    (loader,) = _objects("loader.yaml")
    mounts = {m["name"]: m["mountPath"] for m in loader["spec"]["containers"][0]["volumeMounts"]}
    loader_claims = {
        v["persistentVolumeClaim"]["claimName"]: mounts[v["name"]] for v in loader["spec"]["volumes"]
    }
    assert set(loader_claims) == claims

    (source,) = JOB["spec"]["sources"]
    pvc = source["pvc"]
    checkpoint = JOB["spec"]["training"]["checkpoint"]
    assert {pvc["claimName"], checkpoint["persistentVolumeClaim"]} == claims
    # The data is copied to <loader's mount>/<subPath>/..., which the job mounts at source.mountPath.
    data_root = f"{loader_claims[pvc['claimName']]}/{pvc['subPath']}"
    for key in ("train", "eval"):
        path = JOB["spec"]["data"][key]
        assert path.startswith(source["mountPath"] + "/")
        file = path.removeprefix(source["mountPath"] + "/")
        assert f"kubectl cp {source['local'].replace('data/', 'examples/data/')}/{file} " in DOC.replace(
            "  ", " "
        )
        assert f"rl/rl-loader:{data_root}/{file}" in DOC
        assert (ROOT / "examples" / source["local"] / file).is_file()
    # Checkpoints are fetched from where the learner writes them: checkpoint.dir is the claim's mount point.
    assert loader_claims[checkpoint["persistentVolumeClaim"]] == checkpoint["dir"]
    steps = JOB["spec"]["training"]["steps"]
    assert steps % checkpoint["every"] == 0
    assert f"rl/rl-loader:{checkpoint['dir']}/checkpoint-{steps} " in DOC


def test_every_named_file_value_and_pod_exists() -> None:
    named = set(re.findall(r"\b((?:examples|charts|docs|scripts)/[\w./-]*\w)", DOC))
    assert "examples/tiny-grpo-cluster.yaml" in named and "examples/cluster/loader.yaml" in named
    missing = [n for n in named if not (ROOT / n).exists()]
    assert missing == []

    values = yaml.safe_load((ROOT / "charts" / "dverl" / "values.yaml").read_text())
    for key in re.findall(r"--set ([\w.]+)=", DOC):
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"docs/cluster.md sets unknown chart value {key}"
            node = node[part]

    spec = {k: v for k, v in JOB["spec"].items() if k != "sources"}  # sources: the pods' volumes only
    plan = plan_job(JobSpec.model_validate(spec), JOB["metadata"]["name"])
    pods = {w.name for w in plan.workers}
    for pod in set(re.findall(r"\b(tiny-grpo-cluster-[a-z]+-\d+)\b", DOC)):
        assert pod in pods, f"docs/cluster.md names pod {pod}; the operator makes {sorted(pods)}"
    assert "kubectl -n rl apply -f examples/tiny-grpo-cluster.yaml" in DOC
    assert "kubectl -n rl get rlhfjobs -w" in DOC
    assert "What was and was not tested" in DOC
