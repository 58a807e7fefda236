"""`dverl status JOB --ray ADDRESS`: a job run by the Ray executor, read from the cluster itself.

The supervisor keeps the job's record (step, phase, addresses, restarts) in a named actor, and every
worker is a named actor of its own; both are asked here, so the answer is what the cluster holds now,
not what a file on some machine last said.
"""

from __future__ import annotations

import json
from typing import Any

from decentralized_verl.errors import DverlError
from decentralized_verl.launch.ray_executor import connect
from decentralized_verl.launch.ray_placement import NAMESPACE, record_name

CALL_TIMEOUT_S = 10.0


class JobNotFound(DverlError):
    pass


def job_names(ray: Any) -> list[str]:
    """Jobs the cluster runs now: every job record among the namespace's named actors."""
    names = ray.util.list_named_actors(all_namespaces=True)
    suffix = record_name("")
    return sorted(
        entry["name"][: -len(suffix)]
        for entry in names
        if entry.get("namespace") == NAMESPACE and entry["name"].endswith(suffix)
    )


def _worker_state(ray: Any, name: str) -> dict[str, Any]:
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return {"name": name, "state": "no actor"}
    try:
        code, pid = ray.get([actor.poll.remote(), actor.pid.remote()], timeout=CALL_TIMEOUT_S)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return {"name": name, "state": "actor lost"}
    if pid is None:
        state = "placed"
    elif code is None:
        state = "running"
    else:
        state = f"exited {code}"
    return {"name": name, "state": state, "pid": pid}


def read_status(ray: Any, job: str) -> dict[str, Any]:
    """The job's record and each of its workers' state, from the cluster."""
    try:
        record = ray.get_actor(record_name(job), namespace=NAMESPACE)
    except ValueError:
        running = job_names(ray)
        raise JobNotFound(
            f"no job {job!r} on this Ray cluster (jobs running: {', '.join(running) or 'none'})"
        ) from None
    state = ray.get(record.read.remote(), timeout=CALL_TIMEOUT_S)
    addresses = state.get("addresses", {})
    restarts = state.get("restarts", {})
    workers = []
    for name in state.get("workers", []):
        worker = _worker_state(ray, name)
        worker["address"] = addresses.get(name)
        worker["restarts"] = restarts.get(name, 0)
        workers.append(worker)
    return {
        "job": job,
        "step": state.get("step"),
        "total_steps": state.get("total_steps"),
        "phase": state.get("phase"),
        "output": state.get("output"),
        "workers": workers,
    }


def format_status(status: dict[str, Any]) -> str:
    step = status["step"]
    progress = "starting" if step is None else f"step {step}/{status['total_steps']} ({status['phase']})"
    lines = [f"{status['job']}: {progress}; run folder {status['output']}"]
    for w in status["workers"]:
        lines.append(
            f"  {w['name']:<32} {w['state']:<12} {w.get('address') or '-':<22} restarts {w['restarts']}"
        )
    return "\n".join(lines)


def main_ray_status(address: str, job: str, *, as_json: bool = False) -> int:
    status = read_status(connect(address), job)
    print(json.dumps(status, indent=2) if as_json else format_status(status))
    return 0
