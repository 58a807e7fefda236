"""Does the job fit? Each role's workers, pool by pool, estimated (memory.py) and compared with the memory
one worker has (devices.py); a worker that cannot fit gets the settings that would make it fit, each
computed by estimating again with that setting changed.

`plan_memory` is pure (shapes come from a lookup function); `plan_problems(spec, base_dir)` finds the
shapes (reading config.json files when `base_dir` is given) and returns the refusals as `Problem`s naming
the field to change. A model whose shape cannot be found, or a GPU whose memory is not known, is "not
checked", never refused.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from decentralized_verl.errors import Problem
from decentralized_verl.planning import fixes, workers
from decentralized_verl.planning.devices import GIB, Placement, placements
from decentralized_verl.planning.fixes import gib
from decentralized_verl.planning.locate import ShapeLookup, model_shape
from decentralized_verl.planning.memory import Estimate
from decentralized_verl.planning.rollout_memory import VLLM_UTILIZATION
from decentralized_verl.planning.shapes import ModelShape
from decentralized_verl.planning.span_choice import SpanChoice, choose_spans, with_spans
from decentralized_verl.planning.workers import Job
from decentralized_verl.spec import JobSpec, ModelSpec, RoleSpec

Verdict = Literal["fits", "does not fit", "not checked"]


@dataclass(frozen=True)
class WorkerPlan:
    """The workers of one role in one node pool: their estimate, what they have, and the verdict."""

    role: str
    placement: Placement
    estimate: Estimate
    gpu_budget: int | None
    """Usable GPU memory: the GPU's, or the vLLM engine's share of it."""
    host_budget: int | None
    verdict: Verdict
    reason: str = ""
    fixes: tuple[str, ...] = ()

    @property
    def problem(self) -> Problem | None:
        if self.verdict != "does not fit":
            return None
        fixes = "; or ".join(self.fixes)
        return Problem(self.field, f"{self.reason}; it fits with {fixes}" if fixes else self.reason)

    @property
    def field(self) -> str:
        """The field a person changes: the pool, or the role's memory setting."""
        p = self.placement
        if p.pool is not None:
            return p.field
        if p.gpu is not None and self.gpu_budget is not None and self.estimate.gpu > self.gpu_budget:
            return p.gpu.field
        return p.host.field


@dataclass(frozen=True)
class MemoryPlan:
    workers: tuple[WorkerPlan, ...]
    notes: tuple[str, ...] = ()
    shapes: tuple[tuple[str, ModelShape], ...] = ()
    """(role, the shape its estimate used)."""
    spec: JobSpec | None = None
    """The spec as planned: the one given, or with the rollout's spans the planner chose written in."""
    span_choice: SpanChoice | None = None
    """The planner's own decision to serve the rollout as spans (or why it could not), when it made one."""

    @property
    def chosen_spans(self) -> int | None:
        """Spans per rollout worker the planner chose (None: it chose none, or the spec said)."""
        return self.span_choice.count if self.span_choice is not None else None

    def problems(self) -> list[Problem]:
        return [w.problem for w in self.workers if w.problem is not None]


# ---------------------------------------------------------------------------------------- verdicts


def _shortfall(role: str, estimate: Estimate, gpu: int | None, host: int | None, placement: Placement) -> str:
    where = f"pool {placement.pool!r}" if placement.pool else "each worker"
    if placement.on_gpu and gpu is not None and estimate.gpu > gpu:
        kind, need, have = "GPU", estimate.gpu, gpu
        source = placement.gpu.source if placement.gpu else ""
        if placement.gpu is not None and placement.gpu.bytes is not None and gpu < placement.gpu.bytes:
            source += f" x vLLM's gpu_memory_utilization {VLLM_UTILIZATION}"
        device = "gpu"
    else:
        kind, need, have, source, device = "host", estimate.host, host or 0, placement.host.source, "host"
    parts = [c for c in estimate.components if c.device == device and c.bytes >= GIB // 20]
    breakdown = ", ".join(f"{c.name} {gib(c.bytes)}" for c in parts)
    return (
        f"{role} needs ~{gib(need)} GiB of {kind} memory per worker ({breakdown}) but {where} has "
        f"{gib(have)} GiB ({source})"
    )


def _worker_plan(
    role: str, job: Job, placement: Placement, estimate: Estimate, find_fixes: Callable[[], list[str]]
) -> WorkerPlan:
    gpu, host = workers.budgets(role, job, placement)
    verdict = workers.fits(estimate, gpu, host, placement.on_gpu)
    if verdict is None:
        missing = placement.gpu.source if placement.on_gpu and placement.gpu else "resources.memory not given"
        return WorkerPlan(role, placement, estimate, gpu, host, "not checked", missing)
    if verdict:
        return WorkerPlan(role, placement, estimate, gpu, host, "fits")
    reason = _shortfall(role, estimate, gpu, host, placement)
    return WorkerPlan(role, placement, estimate, gpu, host, "does not fit", reason, tuple(find_fixes()))


# --------------------------------------------------------------------------------------------- plan


def _role_plans(name: str, job: Job) -> Iterator[WorkerPlan]:
    role: RoleSpec = getattr(job.spec.roles, name)
    for placement in placements(name, role):
        on_gpu = placement.on_gpu
        if name == "learner":
            e = workers.learner(job, placement, job.training_setup(name), job.learner_micro(not on_gpu))
            fix = functools.partial(fixes.training_fixes, name, job, placement)
        elif name == "critic":
            e = workers.critic(job, placement, job.training_setup(name), job.critic_micro())
            fix = functools.partial(fixes.training_fixes, name, job, placement)
        elif name == "rollout":
            e = workers.rollout(job, placement)
            fix = functools.partial(fixes.rollout_fixes, job, placement)
        else:  # reference, reward: a frozen model's forward
            build = functools.partial(
                workers.reference if name == "reference" else workers.reward, job, placement
            )
            e = build()
            fix = functools.partial(fixes.scoring_fixes, name, job, placement, build)
        yield _worker_plan(name, job, placement, e, fix)


def _models(spec: JobSpec) -> dict[str, ModelSpec]:
    """Each role that holds a model, and which (a reward role holds one only for a reward model)."""
    roles = spec.roles
    out = {"learner": spec.model, "rollout": spec.model}
    if roles.reference is not None:
        out["reference"] = spec.model.model_copy(update={"lora": None})
    if roles.critic is not None:
        out["critic"] = roles.critic.model or spec.model
    if roles.reward is not None and spec.data.reward_type == "reward_model":
        model = roles.reward.model or spec.data.reward_model
        if model is not None:
            out["reward"] = model
    return out


def plan_memory(spec: JobSpec, lookup: Callable[[ModelSpec], ShapeLookup]) -> MemoryPlan:
    """Every role's workers, pool by pool, estimated and checked. Pure given `lookup`."""
    shapes: dict[str, ModelShape] = {}
    notes: list[str] = []
    models = _models(spec)
    for role, model in models.items():
        found = lookup(model)
        if found.shape is not None:
            shapes[role] = found.shape
        else:
            notes.append(f"{role}: not checked: {found.why_not}")
    job = Job(spec, shapes)
    choice = choose_spans(job)
    if choice is not None and choice.count is not None:  # every estimate below sees the chosen chain
        notes.append(choice.words())
        spec = with_spans(spec, choice.count)
        job = Job(spec, shapes)
    plans: list[WorkerPlan] = []
    for name, _ in spec.roles.items():
        if name in models and name not in shapes:
            continue  # its model's shape is unknown: said in the notes
        if name == "learner" and any(r in models and r not in shapes for r in _inside_learner(spec)):
            notes.append("learner: not checked: a role running inside it (replicas 0) has an unknown model")
            continue
        plans.extend(_role_plans(name, job))
    if choice is not None and choice.count is None:  # the refusal says spans were weighed too
        plans = [
            dataclasses.replace(w, reason=f"{w.reason}; {choice.words()}")
            if w.role == "rollout" and w.verdict == "does not fit"
            else w
            for w in plans
        ]
    return MemoryPlan(tuple(plans), tuple(notes), tuple(sorted(shapes.items())), spec, choice)


def _inside_learner(spec: JobSpec) -> list[str]:
    return [name for name, role in spec.roles.items() if name != "learner" and role.replicas == 0]


def plan_for(spec: JobSpec, base_dir: Path | None) -> MemoryPlan:
    """`plan_memory` with shapes found from files next to the manifest (`base_dir`), or, with None (the
    operator, which cannot read a user's folders), from `model.tiny` and the known-shapes table alone."""
    cache: dict[str, ShapeLookup] = {}

    def lookup(model: ModelSpec) -> ShapeLookup:
        key = model.model_dump_json(exclude={"lora", "dtype"})
        if key not in cache:
            cache[key] = model_shape(model, base_dir)
        return cache[key]

    return plan_memory(spec, lookup)


def planned_spec(spec: JobSpec, plan: MemoryPlan) -> JobSpec:
    """`spec` as its workers run it: with the rollout's spans the planner chose (`plan`, made from `spec`
    or a localized copy of it) written in, else unchanged."""
    count = plan.chosen_spans
    return with_spans(spec, count) if count is not None else spec


def plan_problems(spec: JobSpec, base_dir: Path | None) -> list[Problem]:
    """The memory refusals of a job, each naming the pool or memory field, with the fixes that fit."""
    return plan_for(spec, base_dir).problems()
