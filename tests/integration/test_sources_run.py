"""`dverl run` on a manifest written for a cluster: pod paths under a source become paths under its local
folder, a URI source is fetched into the local cache (digest checked) and mapped, a source that exists
only in a cluster and has no local folder stops the run naming its field; and the job trains.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.sources.fetch import FetchError
from decentralized_verl.spec.manifest import load_job
from tests.support.job_manifests import cluster_manifest
from tests.support.paths import TOY
from tests.support.sources_server import serving


def written(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["spec"]


def test_local_folder_and_fetched_uri_stand_in_for_the_pod_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(TOY, tmp_path / "toy")
    eval_bytes = (TOY / "eval.jsonl").read_bytes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with serving() as server:
        server.files["/bucket/toy/eval.jsonl"] = eval_bytes
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.url)
        sources = [
            {"name": "toy", "mountPath": "/data", "local": "toy", "pvc": {"claimName": "rl-data"}},
            {
                "name": "evals",
                "mountPath": "/eval",
                "uri": {
                    "url": "s3://bucket/toy/eval.jsonl",
                    "sha256": hashlib.sha256(eval_bytes).hexdigest(),
                },
            },
        ]
        manifest = cluster_manifest(tmp_path, sources)
        job = load_fitting_job(manifest)
        spec = written(write_config(job, manifest, tmp_path / "run"))
        assert spec["data"]["train"] == str((tmp_path / "toy" / "train.jsonl").resolve())
        fetched = Path(spec["data"]["eval"])
        assert fetched.is_relative_to(tmp_path / "cache" / "dverl" / "sources")
        assert fetched.read_bytes() == eval_bytes
        write_config(job, manifest, tmp_path / "again")
        assert server.hits["/bucket/toy/eval.jsonl"] == 1  # cached
        assert spec["sources"][0]["mountPath"] == "/data"  # the manifest itself is unchanged


def test_wrong_digest_of_a_uri_source_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with serving() as server:
        server.files["/b/eval.jsonl"] = b"changed\n"
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.url)
        sources = [
            {"name": "toy", "mountPath": "/data", "local": str(TOY), "pvc": {"claimName": "c"}},
            {"name": "evals", "mountPath": "/eval", "uri": {"url": "s3://b/eval.jsonl", "sha256": "0" * 64}},
        ]
        manifest = cluster_manifest(tmp_path, sources)
        with pytest.raises(FetchError, match=r"SHA-256 is .* expected 0{64}"):
            write_config(load_job(manifest), manifest, tmp_path / "run")
