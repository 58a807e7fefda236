"""`dverl validate examples/*.yaml` checks every shipped file: a multi-document Kubernetes bundle's
RLHFJobs (one carried in a ConfigMap too) with the other kinds named as not checked, and a stages config
by its own rules; a bad job anywhere in a bundle is refused by its document and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from decentralized_verl.cli.main import main
from tests.support.paths import EXAMPLES


def test_every_shipped_example_validates(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in EXAMPLES.glob("*.yaml"))
    assert main(["validate", *files]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "RLHFJob tiny-grpo-ray: valid" in out  # the job the KubeRay bundle's ConfigMap carries
    assert "kuberay-rayjob.yaml[2]: RayJob tiny-grpo-ray: not an RLHFJob, not checked" in err
    assert "stages config" in out and "stages.yaml: valid — stages sft, reward, rlhf" in out


def _bundle(tmp_path: Path, job: dict) -> Path:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
                  "data": {"job.yaml": yaml.safe_dump(job)}}  # fmt: skip
    ray = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r"}}
    path = tmp_path / "bundle.yaml"
    path.write_text(yaml.safe_dump_all([config_map, ray]))
    return path


def test_a_bad_job_inside_a_bundle_is_refused_by_document_and_field(tmp_path: Path, capsys) -> None:
    job = yaml.safe_load((EXAMPLES / "tiny-grpo.yaml").read_text())
    job["spec"]["training"]["steps"] = -1
    assert main(["validate", str(_bundle(tmp_path, job))]) == 2
    err = capsys.readouterr().err
    assert "bundle.yaml[0] (ConfigMap cm data.job.yaml): spec.training.steps:" in err
    assert main(["validate", "--json", str(_bundle(tmp_path, job))]) == 2
    results = json.loads(capsys.readouterr().out)
    assert [r.get("valid") for r in results] == [False, None]
    assert results[1] == {
        "file": f"{tmp_path / 'bundle.yaml'}[1]",
        "kind": "RayJob",
        "name": "r",
        "checked": False,
    }


def test_a_bundle_without_any_job_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "nothing.yaml"
    path.write_text(yaml.safe_dump_all([{"kind": "ConfigMap", "data": {"a": "b"}}, {"kind": "Service"}]))
    assert main(["validate", str(path)]) == 2
    assert "none of its 2 YAML documents is an RLHFJob" in capsys.readouterr().err


def test_a_bad_stages_config_is_refused_by_field(tmp_path: Path, capsys) -> None:
    stages = yaml.safe_load((EXAMPLES / "stages.yaml").read_text())
    stages["reward"]["initFrom"] = "sft"
    del stages["sft"]
    path = tmp_path / "stages.yaml"
    path.write_text(yaml.safe_dump(stages))
    assert main(["validate", str(path)]) == 2
    assert "reward.initFrom: 'sft' needs an sft section" in capsys.readouterr().err
