"""`dverl plan FILE.yaml`: print what fits (each role's memory per worker and pool, checked against its
GPUs) as a table or JSON, or with `--workers` the worker processes the job starts.

Exits 2 when the memory plan has a problem, so a script can gate a submission on it.
"""

from __future__ import annotations

import json

from decentralized_verl.planning.fitting_job import load_planned_job
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.planning.report import render, to_json


def print_workers(file: str, as_json: bool = False) -> int:
    """One line per worker process of the job: role, index, pool, GPUs and the command it runs."""
    job, _ = load_planned_job(file)  # with the spans the planner chose, as `dverl run` starts them
    workers = plan_job(job.spec, job.metadata.name).workers
    if as_json:
        rows = [
            {
                "name": w.name,
                "role": w.role,
                "index": w.index,
                "pool": w.pool,
                "gpus": w.gpus,
                "cpu": w.cpu,
                "memory": w.memory,
                "command": w.command(),
            }
            for w in workers
        ]
        print(json.dumps(rows, indent=2))
        return 0
    for worker in workers:
        pool = f" pool={worker.pool}" if worker.pool else ""
        print(
            f"{worker.name}: role={worker.role} index={worker.index}{pool} gpus={worker.gpus} "
            f"cmd={' '.join(worker.command())}"
        )
    return 0


def main_plan(file: str, *, as_json: bool = False, workers: bool = False) -> int:
    """Print the job's memory plan (or its workers); 2 when the plan has problems, else 0."""
    if workers:
        return print_workers(file, as_json)

    _, plan = load_planned_job(file)
    print(json.dumps(to_json(plan), indent=2) if as_json else render(plan))
    return 2 if plan.problems() else 0
