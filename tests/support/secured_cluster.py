"""The local cluster `dverl run` starts for a manifest, on its secured path (TLS, the job token on every
call, signed weights), for tests that drive the workers themselves (kill one, watch the coordinator)."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.security.credentials import JobCredentials, run_folder_credentials
from decentralized_verl.spec.manifest import load_job


def secured_cluster(manifest: Path, output: Path) -> tuple[LocalCluster, JobCredentials]:
    """The cluster (not started) and the credentials a caller of its workers presents (the observer's:
    Status and Ready, what `dverl run` itself holds)."""
    job = load_job(manifest)
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    cluster = LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local)
    return cluster, local.for_role("observer")
