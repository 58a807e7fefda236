"""`dverl worker --role ROLE`: one process of a job, in a pod, under `dverl run`, or on a volunteer.

Reads the job config (the ConfigMap's job.yaml or `dverl run`'s copy), builds the role and serves it
over gRPC until SIGTERM. The learner role runs the training loop instead (roles/learner.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from decentralized_verl.lifecycle import until_stopped
from decentralized_verl.manifest import load_job
from decentralized_verl.roles.wiring import bind_host
from decentralized_verl.spec import JobSpec

log = logging.getLogger(__name__)


def base_dir_of(config: Path, annotations: dict | None) -> Path:
    """Where relative data paths resolve: the manifest's folder `dverl run` recorded, else the config's."""
    recorded = (annotations or {}).get("dverl.io/base-dir")
    return Path(recorded) if recorded else config.parent


async def serve_role(spec: JobSpec, job: str, role: str, index: int, port: int, base_dir: Path) -> int:
    from decentralized_verl.backends.base import make_backend
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.roles import scoring, servicers
    from decentralized_verl.roles.rollout import RolloutWorker
    from decentralized_verl.transport.weight_service import GrpcWeightSource

    worker_id = f"{job}-{role}-{index}"
    if role == "rollout":
        model, tokenizer = load_model_and_tokenizer(spec.model)
        backend = make_backend(spec.roles.rollout.backend, model, tokenizer, seed=spec.training.seed + index)
        learner = os.environ.get("DVERL_LEARNER_ADDR")
        source = GrpcWeightSource(learner) if learner else None
        handler = servicers.RolloutServicer(
            RolloutWorker(backend, worker_id, source, backend_name=spec.roles.rollout.backend)
        )
    elif role == "reference":
        handler = servicers.ReferenceServicer(scoring.ReferenceWorker.from_spec(spec, worker_id=worker_id))
    elif role == "critic":
        handler = servicers.CriticServicer(scoring.CriticWorker.from_spec(spec, worker_id=worker_id))
    elif role == "reward":
        handler = servicers.RewardServicer(scoring.RewardWorker.from_spec(spec))
    else:
        raise ValueError(f"unknown role {role!r}")
    health = servicers.HealthServicer(role=role, worker_id=worker_id, ready=True)
    host = bind_host()
    server = await servicers.serve(port, handler, health, host=host)
    try:
        log.info("%s ready on port %d", worker_id, port)
        await until_stopped()
        return 0
    finally:
        await server.stop(grace=2.0)


def load_worker_config(path: Path, job_name: str | None) -> tuple[JobSpec, str, Path]:
    """A whole RLHFJob manifest (`dverl run`) or the bare spec the operator's ConfigMap holds."""
    from decentralized_verl.errors import ManifestError, Problem
    from decentralized_verl.manifest import load_yaml_text, parse_spec

    document = load_yaml_text(path.read_text(encoding="utf-8"), str(path))
    if isinstance(document, dict) and "kind" in document:
        job = load_job(path)
        extra = job.metadata.model_extra or {}
        return job.spec, job.metadata.name, base_dir_of(path, extra.get("annotations"))
    if not job_name:
        raise ManifestError([Problem("--job", "required when the config is a bare spec")], str(path))
    return parse_spec(document, str(path)), job_name, path.parent


def main_worker(
    config: str, role: str, index: int, port: int, output: str | None, resume: bool, job: str | None = None
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec, name, base = load_worker_config(Path(config), job)
    if role == "learner":
        from decentralized_verl.roles.learner import run

        out = Path(output or os.environ.get("DVERL_OUTPUT") or Path("runs") / name)
        return run(spec, name, port=port, output=out, base_dir=base, resume=resume)
    return asyncio.run(serve_role(spec, name, role, index, port, base))
