"""`spec.sources` and `podTemplate` as `dverl validate` judges them: every bad case named by its field, the
good ones accepted, and model/data paths no source holds flagged for cluster use.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.job_manifests import GOOD_SOURCES as GOOD
from tests.support.job_manifests import sources_spec


def test_dverl_validate_prints_problems_and_warnings(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    document = {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}}
    bad = sources_spec([{"name": "s", "mountPath": "/s", "pvc": {"claimName": "c", "subPath": "../x"}}])
    path.write_text(yaml.safe_dump({**document, "spec": bad}))
    cli = [sys.executable, "-m", "decentralized_verl.cli", "validate", str(path)]
    result = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: spec.sources[0].pvc.subPath: must be a plain relative path" in result.stderr
    good = sources_spec(GOOD[:1], model={"tiny": {}}, data={"train": "/elsewhere/t.jsonl"})
    path.write_text(yaml.safe_dump({**document, "spec": good}))
    result = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"{path}: warning: spec.data.train: '/elsewhere/t.jsonl' lies under no source" in result.stderr


def test_dverl_validate_refuses_a_uri_without_a_digest_unless_the_manifest_accepts_it(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    document = {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}}
    cli = [sys.executable, "-m", "decentralized_verl.cli", "validate", str(path)]
    unchecked = {"name": "m", "mountPath": "/m", "uri": {"url": "https://example.org/m.bin"}}
    path.write_text(yaml.safe_dump({**document, "spec": sources_spec([unchecked], model={"tiny": {}})}))
    result = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "spec.sources[0].uri.sha256: required: give the file's SHA-256, or set insecureSkipDigest" in (
        result.stderr
    )
    unchecked["uri"]["insecureSkipDigest"] = True
    path.write_text(yaml.safe_dump({**document, "spec": sources_spec([unchecked], model={"tiny": {}})}))
    result = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
