"""Which GPU of one machine each worker of a job computes on: the layout `dverl run` starts and
`dverl plan --machine` shows. Pure and torch-free: it is given a description of the machine (how many
GPUs, how much memory each), so a plan for an eight-GPU node can be made anywhere.

The rules (the anchors' defaults):
- several GPUs, enough for every worker that wants one: one role's worker per GPU (separate pools, as
  prime-rl, slime and AReaL lay out by default);
- fewer GPUs than that (a workstation, a one-GPU pod): an HF rollout runs inside the learner and
  generates with the learner's own model (one copy of the weights, the colocated mode), and the other
  workers share the GPUs round-robin within the planner's memory budget; a vLLM rollout is given the
  fraction of its GPU that the planner's estimate needs, never the engine's default of nearly all, and,
  on the learner's GPU, sleeps while the learner updates (`backends/sleep.py`);
- no GPU: everything on the CPU.
A worker the spec keeps on the CPU (`device: cpu`) is never placed on a GPU; one that asks for `cuda` is,
even with `gpus: 0`. The device names come from `runtime/device_choice.py`, the one device home.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from decentralized_verl.errors import DverlError
from decentralized_verl.planning.devices import gpu_type_bytes, quantity_bytes
from decentralized_verl.planning.plan import Plan, PlannedWorker, plan_job
from decentralized_verl.runtime.device_choice import ACCELERATOR, CPU, gpu_env, planned_device
from decentralized_verl.spec import JobSpec

MIN_ENGINE_FRACTION = 0.05
"""The smallest share of a GPU a vLLM engine is given (its own weights and a little KV cache)."""


class MachineError(DverlError):
    """A machine description that cannot be read; the message names the flag."""


@dataclass(frozen=True)
class Machine:
    """One machine's GPUs: how many, and the memory of each (None: not said)."""

    gpus: int
    gpu_memory: int | None = None

    def words(self) -> str:
        memory = f" of {self.gpu_memory / 2**30:.0f} GiB" if self.gpu_memory else ""
        return f"{self.gpus} GPU(s){memory}" if self.gpus else "no GPU"


_MACHINE = re.compile(r"^(?P<gpus>\d+)(?:x(?P<memory>.+))?$")


def parse_machine(text: str, *, field: str = "--machine") -> Machine:
    """`0`, `1`, `8x80Gi` or `8xa100` (a GPU type the planner knows): the machine a layout is made for."""
    found = _MACHINE.match(text.strip())
    if not found:
        raise MachineError(f"{field}: expected GPUS or GPUSxMEMORY, e.g. 1x24Gi or 8xa100 (got {text!r})")
    gpus, memory = int(found["gpus"]), found["memory"]
    if memory is None:
        return Machine(gpus)
    known = gpu_type_bytes(memory)
    if known is not None:
        return Machine(gpus, known)
    try:
        return Machine(gpus, quantity_bytes(memory))
    except ValueError:
        raise MachineError(f"{field}: {memory!r} is neither a memory quantity nor a known GPU type") from None


@dataclass(frozen=True)
class Placed:
    """One worker on the machine: its device, the GPUs it sees, and a vLLM engine's share of one."""

    name: str
    role: str
    device: str
    slots: tuple[int, ...] = ()
    memory_fraction: float | None = None
    shares_with_learner: bool = False
    """A rollout on a GPU the learner computes on too (a vLLM engine there sleeps while it updates)."""

    def env(self) -> dict[str, str]:
        """What the worker starts with: the GPUs it may see and its device (`runtime/device_choice`)."""
        out = {**gpu_env(self.slots), "DVERL_DEVICE": ACCELERATOR if self.slots else CPU}
        if self.memory_fraction is not None:
            out["DVERL_GPU_MEMORY_FRACTION"] = f"{self.memory_fraction:.3f}"
        if self.shares_with_learner:
            out["DVERL_GPU_SHARED_WITH_LEARNER"] = "1"
        return out


@dataclass(frozen=True)
class Layout:
    machine: Machine
    placed: tuple[Placed, ...]
    colocated: tuple[str, ...] = ()
    """Roles moved inside the learner for this machine (`rollout`: one copy of the weights)."""
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def of(self, name: str) -> Placed:
        return next(p for p in self.placed if p.name == name)


def machine_job(spec: JobSpec, job: str, machine: Machine) -> tuple[JobSpec, Plan, tuple[str, ...]]:
    """The spec as it runs on `machine` (an HF rollout moved inside the learner when the GPUs are too few,
    `colocate_for`), its plan, and the roles so moved."""
    plan = plan_job(spec, job)
    colocated = colocate_for(spec, plan, machine)
    if not colocated:
        return spec, plan, ()
    roles = spec.roles.model_copy(update={"rollout": spec.roles.rollout.model_copy(update={"replicas": 0})})
    moved = spec.model_copy(update={"roles": roles})
    return moved, plan_job(moved, job), colocated


def wants_gpu(spec: JobSpec, worker: PlannedWorker) -> bool:
    """Whether the worker computes on a GPU when the machine has one: it was given GPUs, or its role says
    `cuda`; never when its role says `cpu`."""
    override = _role(spec, worker.role).device if _role(spec, worker.role) is not None else "auto"
    return override != CPU and (worker.gpus > 0 or override == ACCELERATOR)


def _role(spec: JobSpec, role: str):
    return getattr(spec.roles, "rollout" if role == "span" else role, None)


def _gpu_workers(spec: JobSpec, workers: Sequence[PlannedWorker]) -> list[PlannedWorker]:
    return [w for w in workers if w.role != "dht" and wants_gpu(spec, w)]


def colocate_for(spec: JobSpec, plan: Plan, machine: Machine) -> tuple[str, ...]:
    """Roles to run inside the learner on this machine: an HF rollout (no spans) when the GPU workers
    outnumber the GPUs and both it and the learner want one, so the two share one copy of the weights."""
    gpu_workers = _gpu_workers(spec, plan.workers)
    needed = sum(max(1, w.gpus) for w in gpu_workers)
    rollout = spec.roles.rollout
    if machine.gpus == 0 or needed <= machine.gpus or rollout.replicas == 0:
        return ()
    roles = {w.role for w in gpu_workers}
    shares = rollout.backend_kind.shares_learner_weights  # capabilities, never a backend's name
    if {"rollout", "learner"} <= roles and shares and rollout.spans is None:
        return ("rollout",)
    return ()


def lay_out(
    spec: JobSpec,
    plan: Plan,
    machine: Machine,
    gpu_bytes: Mapping[str, int] | None = None,
    colocated: tuple[str, ...] = (),
) -> Layout:
    """Each planned worker's device on `machine`. `gpu_bytes`: the planner's GPU estimate per role (for
    the shared-GPU budget and a vLLM engine's fraction); `colocated`: roles already moved inside the
    learner (`colocate_for`), said in the notes."""
    gpu_bytes = gpu_bytes or {}
    notes = [f"{role} runs inside the learner: one copy of the weights on the GPU" for role in colocated]
    gpu_workers = _gpu_workers(spec, plan.workers)
    placed: dict[str, Placed] = {}
    problems: list[str] = []
    if machine.gpus == 0 and gpu_workers:
        notes.append("no GPU: workers given one compute on the CPU")
    needed = sum(max(1, w.gpus) for w in gpu_workers)
    load = [0] * max(machine.gpus, 1)
    holders: list[list[str]] = [[] for _ in range(max(machine.gpus, 1))]
    cursor = 0
    for worker in gpu_workers if machine.gpus else []:
        count = min(max(1, worker.gpus), machine.gpus)
        if needed <= machine.gpus:  # one per GPU
            slots = tuple(range(cursor, cursor + count))
            cursor += count
        else:  # shared: the least loaded GPUs first
            slots = tuple(sorted(sorted(range(machine.gpus), key=lambda g: (load[g], g))[:count]))
        per_gpu = gpu_bytes.get(worker.role, 0) // max(1, count)
        for g in slots:
            load[g] += per_gpu
            holders[g].append(worker.name)
        fraction = _engine_fraction(spec, worker, per_gpu, machine)
        placed[worker.name] = Placed(
            worker.name, worker.role, planned_device(1, "auto", slots[0]), slots, fraction
        )
    if needed > machine.gpus > 0:
        notes.append(f"{needed} GPU worker(s) share {machine.words()}")
        if machine.gpu_memory:
            for g, used in enumerate(load):
                if used > machine.gpu_memory:
                    problems.append(
                        f"GPU {g}: {', '.join(holders[g])} need {used / 2**30:.1f} GiB together, it has "
                        f"{machine.gpu_memory / 2**30:.1f} GiB"
                    )
    learner_slots = {g for p in placed.values() if p.role == "learner" for g in p.slots}
    for name, p in placed.items():
        if p.role == "rollout" and learner_slots.intersection(p.slots):
            placed[name] = dataclasses.replace(p, shares_with_learner=True)
    for worker in plan.workers:
        if worker.name not in placed:
            placed[worker.name] = Placed(worker.name, worker.role, CPU)
    ordered = tuple(placed[w.name] for w in plan.workers)
    return Layout(machine, ordered, colocated, tuple(problems), tuple(notes))


def _engine_fraction(spec: JobSpec, worker: PlannedWorker, need: int, machine: Machine) -> float | None:
    """A vLLM rollout's share of its GPU: what the planner estimates it needs (weights, KV cache for its
    batch), rounded up to a hundredth; None for other workers, or without the GPU's memory."""
    if worker.role != "rollout" or not spec.roles.rollout.backend_kind.reserves_gpu_share:
        return None
    if not machine.gpu_memory:
        return None
    if need <= 0:
        return None
    return min(0.95, max(MIN_ENGINE_FRACTION, math.ceil(100 * need / machine.gpu_memory) / 100))
