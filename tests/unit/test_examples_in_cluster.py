"""Every shipped example can run in a cluster as shipped: its model and data paths are ones a pod sees
(relative paths resolve in the image's examples folder, absolute ones lie under a source), examples that
need vLLM or verifiers name the worker image built with them, and a path no pod can see is an error for
a cluster target (`dverl validate --target cluster`, and the operator) while `dverl run` only warns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from decentralized_verl.entrypoints.worker_config import base_dir_of
from decentralized_verl.planning.run_validate import main_validate
from decentralized_verl.spec.manifest import load_job, parse_spec
from decentralized_verl.spec.source_paths import CONFIG_DIR, IMAGE_EXAMPLES_DIR, unseen_paths
from dverl_operator.status import conditions as cond
from tests.support.cluster_world import World
from tests.support.dockerfile import parse_dockerfile
from tests.support.job_manifests import EXAMPLE_JOBS
from tests.support.operator_fixtures import tiny_spec
from tests.support.paths import ROOT

BUILD_ARG_OF_TAG = {"vllm": "VLLM", "vllm-cpu": "VLLM", "verifiers": "WITH_VERIFIERS"}


@pytest.mark.parametrize("example", EXAMPLE_JOBS, ids=lambda p: p.stem)
def test_every_example_names_only_paths_a_pod_sees(example: Path) -> None:
    job = load_job(example)
    assert unseen_paths(job.spec) == []
    for field, path in _paths(job.spec):
        if not path.startswith("/"):  # found in the image, where the examples folder is copied whole
            assert (ROOT / "examples" / path).exists(), f"{field}: {path} is not in the image's examples"


def _paths(spec: Any) -> list[tuple[str, str]]:
    from decentralized_verl.spec.source_paths import model_and_data_paths

    return list(model_and_data_paths(spec))


@pytest.mark.parametrize("example", EXAMPLE_JOBS, ids=lambda p: p.stem)
def test_an_example_needing_vllm_or_verifiers_names_the_image_built_with_it(example: Path) -> None:
    spec = load_job(example).spec
    needs = set()
    if any(role.backend == "vllm" for _, role in spec.roles.items() if getattr(role, "backend", None)):
        needs.add("vllm")
    environment = spec.data.environment
    if environment is not None and environment.name == "verifiers":
        needs.add("verifiers")
    if not needs:
        return
    assert spec.image, f"{example.name} needs {needs} but names no image"
    tag = spec.image.rsplit(":", 1)[1]
    flavour = tag.split("-", 1)[1] if "-" in tag else ""
    assert flavour.split("-")[0] in needs, (example.name, spec.image, needs)
    args = parse_dockerfile((ROOT / "Dockerfile").read_text()).args("worker")
    assert BUILD_ARG_OF_TAG[flavour] in args, f"the Dockerfile cannot build {spec.image}"


def test_the_image_carries_the_examples_where_pods_resolve_relative_paths() -> None:
    copies = [
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY examples")
    ]
    assert copies == [f"COPY examples {IMAGE_EXAMPLES_DIR}"]
    # A pod reads the config the operator mounts at CONFIG_DIR: relative paths resolve in the image.
    assert base_dir_of(Path(CONFIG_DIR) / "job.yaml", None) == Path(IMAGE_EXAMPLES_DIR)
    # `dverl run` records the manifest's folder; a config elsewhere resolves next to itself.
    assert base_dir_of(Path("/x/job.yaml"), {"dverl.io/base-dir": "/src/examples"}) == Path("/src/examples")
    assert base_dir_of(Path("/x/job.yaml"), None) == Path("/x")


def unseen_spec(**model: Any) -> dict[str, Any]:
    return {**tiny_spec(), "model": {"path": "/models/Qwen2.5-0.5B", **model}}


def test_a_path_no_pod_sees_is_named_and_the_ones_it_sees_are_not() -> None:
    assert [f for f, _ in unseen_paths(parse_spec(unseen_spec()))] == ["spec.model.path"]
    under_source = {
        **unseen_spec(),
        "sources": [{"name": "models", "mountPath": "/models", "pvc": {"claimName": "models"}}],
    }
    assert unseen_paths(parse_spec(under_source)) == []
    in_image = {**tiny_spec(), "data": {"train": f"{IMAGE_EXAMPLES_DIR}/data/toy/train.jsonl"}}
    assert unseen_paths(parse_spec(in_image)) == []
    relative = {**tiny_spec(), "data": {"train": "data/toy/train.jsonl"}}
    assert unseen_paths(parse_spec(relative)) == []
    absolute_data = {**tiny_spec(), "data": {"train": "/home/me/train.jsonl", "eval": "/srv/eval.jsonl"}}
    assert [f for f, _ in unseen_paths(parse_spec(absolute_data))] == ["spec.data.train", "spec.data.eval"]


def test_dverl_validate_refuses_it_for_a_cluster_and_warns_for_a_local_run(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "job.yaml"
    document = {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}}
    spec = {**tiny_spec(), "data": {"train": "/home/me/train.jsonl"}}
    manifest.write_text(yaml.safe_dump({**document, "spec": spec}))
    assert main_validate([str(manifest)], target="local") == 0
    assert "warning: spec.data.train: '/home/me/train.jsonl' lies under no source's mountPath" in (
        capsys.readouterr().err
    )
    assert main_validate([str(manifest)], target="cluster") == 2
    said = capsys.readouterr().err
    assert f"{manifest}: spec.data.train: '/home/me/train.jsonl' lies under no source's mountPath" in said
    assert "no pod of a cluster can see it" in said


def test_the_operator_refuses_a_path_no_pod_sees_by_field() -> None:
    world = World(unseen_spec())
    world.step()
    assert world.status["phase"] == "Failed" and world.pods == {}
    failed = cond.condition(world.status["conditions"], cond.VALIDATION_FAILED)
    assert failed is not None and failed["message"].startswith(
        "spec.model.path: '/models/Qwen2.5-0.5B' lies under no source's mountPath"
    )
