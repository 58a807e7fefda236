"""`dverl run` on a manifest written for a cluster: pod paths under a source become paths under its local
folder, a URI source is fetched into the local cache (digest checked) and mapped, a source that exists
only in a cluster and has no local folder stops the run naming its field; and the job trains.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.spec.manifest import load_job
from tests.support.job_manifests import cluster_manifest
from tests.support.paths import FIXTURES, TOY


def test_cluster_only_sources_without_a_local_folder_are_named(tmp_path: Path) -> None:
    sources = [
        {"name": "toy", "mountPath": "/data", "pvc": {"claimName": "rl-data"}},
        {"name": "evals", "mountPath": "/eval", "local": "missing", "configMap": {"name": "e"}},
    ]
    manifest = cluster_manifest(tmp_path, sources)
    with pytest.raises(ManifestError) as caught:
        write_config(load_job(manifest), manifest, tmp_path / "run")
    found = [str(p) for p in caught.value.problems]
    assert found[0].startswith("spec.sources[0].local: required to run here: a PVC exists only in a cluster")
    assert found[1].startswith("spec.sources[1].local: no such folder")


def test_planning_reads_the_model_through_its_local_folder(tmp_path: Path) -> None:
    """`dverl validate` and `dverl plan` read config.json where `dverl run` would: a model folder on a PVC
    in a cluster is checked through the folder standing in for it here."""
    from decentralized_verl.planning import plan_for
    from decentralized_verl.sources.local import as_seen_here

    shutil.copytree(FIXTURES / "qwen7b-config", tmp_path / "models" / "qwen7b")
    sources = [
        {"name": "toy", "mountPath": "/data", "local": str(TOY), "pvc": {"claimName": "c"}},
        {"name": "models", "mountPath": "/models", "local": "models", "pvc": {"claimName": "m"}},
    ]
    manifest = cluster_manifest(
        tmp_path,
        sources,
        **{
            "model": {"path": "/models/qwen7b"},
            "data.eval": "/data/eval.jsonl",
            "roles.learner": {"replicas": 1, "resources": {"gpus": 1, "gpuMemory": "24Gi"}},
        },
    )
    spec = load_job(manifest).spec
    here = as_seen_here(spec, tmp_path)
    assert here.model.path == str(tmp_path / "models" / "qwen7b")
    assert plan_for(spec, tmp_path).problems() == []  # the pod path alone: not checked (no file here)
    with pytest.raises(ManifestError) as caught:
        load_fitting_job(manifest)  # through the local folder: a 7B learner does not fit in 24Gi
    assert any(str(p).startswith("spec.roles.learner.resources.gpuMemory") for p in caught.value.problems)
