"""`dverl run` on a manifest written for a cluster: pod paths under a source become paths under its local
folder, a URI source is fetched into the local cache (digest checked) and mapped, a source that exists
only in a cluster and has no local folder stops the run naming its field; and the job trains.

Here the jobs that train end to end; the pure checks in tests/unit/; the ones with real processes and
servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import cluster_manifest
from tests.support.paths import TOY


def test_cluster_form_manifest_trains_under_dverl_run(tmp_path: Path) -> None:
    sources = [{"name": "toy", "mountPath": "/data", "local": str(TOY), "pvc": {"claimName": "rl-data"}}]
    manifest = cluster_manifest(
        tmp_path,
        sources,
        **{
            "data.eval": "/data/eval.jsonl",
            "roles.rollout": {"replicas": 1, "batchSize": 16},
            "training.steps": 2,
            "training.evalEvery": 0,
        },
    )
    run_job(manifest, tmp_path / "run", progress=False, timeout=600)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["samples"] == 128 for r in records)
