"""`dverl plan`: model shapes from config.json alone, per-worker memory estimates checked against each
pool's GPUs, refusals that name the field with fixes that really fit, and the same refusal from
`dverl validate` and the operator.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.planning.fitting_job import load_fitting_job
from tests.support.job_manifests import qwen7b
from tests.support.paths import ROOT
from tests.support.processes import dverl

# ------------------------------------------------------------------------------ CLI and operator


def test_dverl_plan_prints_the_table_and_json() -> None:
    example = str(ROOT / "examples" / "qwen7b-grpo-fsdp.yaml")
    text = dverl("plan", example)
    assert text.returncode == 0, text.stderr
    assert "learner  a100" in text.stdout and "learner  h100" in text.stdout and "fits" in text.stdout
    machine = json.loads(dverl("plan", example, "--json").stdout)
    assert machine["fits"] and machine["shapes"]["learner"]["parameters"] == 7_615_616_512
    learner = next(w for w in machine["workers"] if w["role"] == "learner")
    assert {c["name"] for c in learner["components"]} >= {"weights", "optimizer", "activations", "logits"}


def test_validate_refuses_what_does_not_fit(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "q7.yaml"
    path.write_text(yaml.safe_dump(qwen7b()))
    result = dverl("validate", str(path))
    assert result.returncode == 2
    assert f"{path}: spec.roles.learner.resources.gpuMemory: learner needs" in result.stderr
    assert "sharding: fsdp over" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ManifestError):
        load_fitting_job(path)
    plan = dverl("plan", str(path))
    assert plan.returncode == 2 and "fix: " in plan.stdout
