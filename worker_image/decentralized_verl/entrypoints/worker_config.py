"""A job's worker reads its job config here, torch-free: the config is read before torch loads, so the
worker can leave its memory estimate as its termination message (core/memory_report.py) even when its
memory limit is too small for torch itself."""

from __future__ import annotations

import logging
from pathlib import Path

from decentralized_verl.core.final_report import TERMINATION_LOG
from decentralized_verl.core.memory_report import write_estimate
from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.planning import plan_for
from decentralized_verl.planning.fixes import gib
from decentralized_verl.planning.own_estimate import own_estimate
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.manifest import load_job, load_yaml_text, parse_spec, read_yaml_file
from decentralized_verl.spec.source_paths import CONFIG_DIR, IMAGE_EXAMPLES_DIR

log = logging.getLogger(__name__)


def base_dir_of(config: Path, annotations: dict | None) -> Path:
    """Where relative model and data paths resolve: the manifest's folder `dverl run` recorded; in a pod
    (the config the operator mounts), the image's examples folder, where a shipped example's data lies;
    else the config's own folder."""
    recorded = (annotations or {}).get("dverl.io/base-dir")
    if recorded:
        return Path(recorded)
    if config.parent == Path(CONFIG_DIR):
        return Path(IMAGE_EXAMPLES_DIR)
    return config.parent


def load_worker_config(path: Path, job_name: str | None) -> tuple[JobSpec, str, Path]:
    """A whole RLHFJob manifest (`dverl run`) or the bare spec the operator's ConfigMap holds."""
    document = load_yaml_text(read_yaml_file(path), str(path))
    if isinstance(document, dict) and "kind" in document:
        job = load_job(path)
        extra = job.metadata.model_extra or {}
        return job.spec, job.metadata.name, base_dir_of(path, extra.get("annotations"))
    if not job_name:
        raise ManifestError([Problem("--job", "required when the config is a bare spec")], str(path))
    return parse_spec(document, str(path)), job_name, base_dir_of(path, None)


def leave_memory_estimate(
    spec: JobSpec, role: str, index: int, base_dir: Path, termination_log: Path = TERMINATION_LOG
) -> bool:
    """Plan the job with the model's files (config.json, a GGUF header) found from `base_dir` and leave
    this worker's estimate as its termination message; True when one was written. The estimate only
    advises: a model the planner cannot size, or a planning error, writes nothing and stops nothing
    (loading the model reports a bad one). What it did is logged at DEBUG only: a failed worker's log
    tail is its failure message, and a line here would push the cause out of the part quoted."""
    try:
        plan = plan_for(spec, base_dir)
        estimate = own_estimate(plan, spec, role, index)
    except Exception as exc:  # advice only: the worker goes on, and loading names what is wrong
        log.debug("%s %d: no memory estimate (%s: %s)", role, index, type(exc).__name__, exc)
        return False
    if estimate is None:
        why = "; ".join(n for n in plan.notes if n.startswith(f"{role}:")) or "the planner does not size it"
        log.debug("%s %d: no memory estimate (%s)", role, index, why)
        return False
    if not write_estimate(estimate, termination_log):
        return False
    log.debug(
        "%s %d: the planner estimates ~%s GiB of host memory for this worker (left as the termination "
        "message until it ends, for a kill for memory to name)",
        role,
        index,
        gib(estimate.host_bytes),
    )
    return True
