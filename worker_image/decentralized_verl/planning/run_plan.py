"""`dverl plan FILE.yaml`: print what fits (each role's memory per worker and pool, checked against its
GPUs) as a table or JSON, or with `--workers` the worker processes the job starts and the device each
computes on.

`--machine 1x24Gi` (or `8xa100`) lays the job out on one machine of that description, as `dverl run` would
there (planning/layout.py): which GPU each worker gets, a vLLM engine's share of a shared GPU, and the
roles moved inside the learner. Without it each worker's device is what its pod would get (`cuda` for a
worker given GPUs, else `cpu`).

Exits 2 when the memory plan or the layout has a problem, so a script can gate a submission on it.
"""

from __future__ import annotations

import json

from decentralized_verl.planning.fit import MemoryPlan
from decentralized_verl.planning.fitting_job import load_planned_job
from decentralized_verl.planning.layout import Layout, lay_out, machine_job, parse_machine
from decentralized_verl.planning.plan import Plan, plan_job
from decentralized_verl.planning.report import render, to_json
from decentralized_verl.runtime.device_choice import planned_device
from decentralized_verl.spec import JobSpec


def gpu_estimates(memory: MemoryPlan) -> dict[str, int]:
    """The planner's GPU peak per role (the largest over its pools): the layout's budget."""
    out: dict[str, int] = {}
    for worker in memory.workers:
        out[worker.role] = max(out.get(worker.role, 0), worker.estimate.gpu)
    return out


def _layout(job, memory: MemoryPlan, machine: str | None) -> tuple[JobSpec, Plan, Layout | None]:
    if machine is None:
        return job.spec, plan_job(job.spec, job.metadata.name), None
    spec, plan, colocated = machine_job(job.spec, job.metadata.name, parse_machine(machine))
    return spec, plan, lay_out(spec, plan, parse_machine(machine), gpu_estimates(memory), colocated)


def _device(spec: JobSpec, worker, layout: Layout | None) -> str:
    if layout is not None:
        return layout.of(worker.name).device
    role = getattr(spec.roles, "rollout" if worker.role == "span" else worker.role, None)
    return planned_device(worker.gpus, role.device if role is not None else "auto", None)


def print_workers(file: str, as_json: bool = False, machine: str | None = None) -> int:
    """One line per worker process of the job: role, index, pool, GPUs, device and the command it runs."""
    job, memory = load_planned_job(file)  # with the spans the planner chose, as `dverl run` starts them
    spec, plan, layout = _layout(job, memory, machine)
    if as_json:
        rows = []
        for w in plan.workers:
            row = {
                "name": w.name,
                "role": w.role,
                "index": w.index,
                "pool": w.pool,
                "gpus": w.gpus,
                "device": _device(spec, w, layout),
                "cpu": w.cpu,
                "memory": w.memory,
                "command": w.command(),
            }
            if layout is not None:
                placed = layout.of(w.name)
                row["visible_gpus"] = list(placed.slots)
                row["gpu_memory_fraction"] = placed.memory_fraction
            rows.append(row)
        if layout is None:
            print(json.dumps(rows, indent=2))
        else:
            print(
                json.dumps(
                    {
                        "machine": layout.machine.words(),
                        "workers": rows,
                        "colocated": list(layout.colocated),
                        "notes": list(layout.notes),
                        "problems": list(layout.problems),
                    },
                    indent=2,
                )
            )
        return 2 if layout is not None and layout.problems else 0
    for worker in plan.workers:
        pool = f" pool={worker.pool}" if worker.pool else ""
        fraction = ""
        if layout is not None and layout.of(worker.name).memory_fraction is not None:
            fraction = f" gpu_memory_fraction={layout.of(worker.name).memory_fraction:.2f}"
        print(
            f"{worker.name}: role={worker.role} index={worker.index}{pool} gpus={worker.gpus} "
            f"device={_device(spec, worker, layout)}{fraction} cmd={' '.join(worker.command())}"
        )
    if layout is not None:
        print(f"layout on {layout.machine.words()}:")
        for line in (*layout.notes, *(f"problem: {p}" for p in layout.problems)):
            print(f"  {line}")
    return 2 if layout is not None and layout.problems else 0


def main_plan(file: str, *, as_json: bool = False, workers: bool = False, machine: str | None = None) -> int:
    """Print the job's memory plan (or its workers); 2 when the plan has problems, else 0."""
    if workers or machine is not None:
        return print_workers(file, as_json, machine)

    _, plan = load_planned_job(file)
    print(json.dumps(to_json(plan), indent=2) if as_json else render(plan))
    return 2 if plan.problems() else 0
