"""examples/kuberay-rayjob.yaml: a RayJob whose driver is `dverl run --ray auto`. Its RLHFJob is valid
and fits the RayCluster it asks for; the RayJob itself is checked against KubeRay's CRD schema (its
types, enums, required fields, and no field the API server would drop) where that CRD is at hand:
KUBERAY_CRD=path/to/ray.io_rayjobs.yaml (KubeRay's ray-operator/config/crd/bases; no package registry
ships it, so it is not fetched here)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from decentralized_verl.launch.ray_placement import actor_options
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import parse_job
from tests.support.paths import ROOT

EXAMPLE = ROOT / "examples" / "kuberay-rayjob.yaml"


def _documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def _cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_rayjob_runs_its_rlhfjob_with_dverl_on_the_ray_cluster() -> None:
    docs = _documents()
    job_yaml = docs["ConfigMap"]["data"]["job.yaml"]
    job = parse_job(yaml.safe_load(job_yaml), "job.yaml")
    ray_job = docs["RayJob"]["spec"]
    command = shlex.split(ray_job["entrypoint"])
    assert command[:3] == ["dverl", "run", "/etc/dverl/job.yaml"]
    assert command[command.index("--ray") + 1] == "auto"
    head = ray_job["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    assert (
        mounts["job"] == "/etc/dverl"
        and volumes["job"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    )
    output = command[command.index("--output") + 1]
    assert output.startswith(mounts["runs"] + "/")  # the run folder is on the shared claim
    claim = volumes["runs"]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert "ReadWriteMany" in docs["PersistentVolumeClaim"]["spec"]["accessModes"]
    assert job.spec.data.train.startswith(mounts["data"] + "/")

    # every worker's actor fits one worker node, and all of them fit the worker group together
    group = ray_job["rayClusterSpec"]["workerGroupSpecs"][0]
    node_cpus = float(group["rayStartParams"]["num-cpus"])
    assert node_cpus <= _cpus(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    asks = [actor_options(w)["num_cpus"] for w in plan_job(job.spec, job.metadata.name).workers]
    assert max(asks) <= node_cpus and sum(asks) <= node_cpus * group["replicas"], asks
    assert float(ray_job["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"]) == 0


# --------------------------------------------------------------------------- KubeRay's CRD schema
def _schema() -> dict:
    path = os.environ.get("KUBERAY_CRD")
    if not path or not Path(path).is_file():
        pytest.skip("KubeRay's RayJob CRD is not at hand (set KUBERAY_CRD to its ray.io_rayjobs.yaml)")
    crd = yaml.safe_load(Path(path).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def unknown_fields(value: Any, schema: dict, path: str = "") -> Iterator[str]:
    """Fields the schema does not declare (the API server prunes them silently, so a typo would be lost)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                yield f"{path}.{key}"
            else:
                yield from unknown_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            yield from unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from unknown_fields(item, schema["items"], f"{path}[{index}]")


def schema_problems(document: dict, schema: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft4Validator(schema)
    problems = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)
    ]
    return problems + [f"{field}: not in the schema" for field in unknown_fields(document, schema)]


def test_the_rayjob_is_valid_against_kuberays_crd() -> None:
    schema = _schema()
    assert schema_problems(_documents()["RayJob"], schema) == []


def test_the_schema_check_catches_a_misspelt_or_mistyped_field() -> None:
    schema = _schema()
    bad = _documents()["RayJob"]
    bad["spec"]["entrypiont"] = bad["spec"].pop("entrypoint")
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    problems = schema_problems(bad, schema)
    assert ".spec.entrypiont: not in the schema" in problems
    assert any("rayClusterSpec.workerGroupSpecs.0.replicas" in p and "'two'" in p for p in problems), problems
