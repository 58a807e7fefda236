"""The settings that would make a worker fit, each found by estimating again with it changed: one saving
alone when one suffices (all of them that do), else savings added one after another, else the GPU memory
it would take. Each fix is also applied to the spec and checked against the spec's own rules, so a fix
that needs another change (more fsdp learners change the batch arithmetic) says so. Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from decentralized_verl.planning import workers
from decentralized_verl.planning.devices import GIB, Placement
from decentralized_verl.planning.memory import Estimate, MicroBatch, Trainable, TrainingSetup
from decentralized_verl.planning.workers import Job
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.manifest import problems_from_validation_error

DEFAULT_LORA = Trainable(lora_rank=8, lora_targets=("q_proj", "v_proj"))
"""What `model.lora: {}` gives (the spec's defaults): the LoRA a fix proposes."""
MAX_SHARDS = 1024
TENSOR_PARALLEL = (2, 4, 8)


@dataclass(frozen=True)
class Change:
    """Settings a person writes, and the same as a patch of the spec (camelCase; None removes a key)."""

    settings: tuple[str, ...] = ()
    patch: Mapping[str, Any] = field(default_factory=dict)

    def __add__(self, other: Change) -> Change:
        return Change(self.settings + other.settings, _merged(self.patch, other.patch))


def _merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _role_patch(role: str, **fields: Any) -> dict[str, Any]:
    return {"roles": {role: fields}}


def then_needed(spec: JobSpec, change: Change) -> str:
    """What the spec's rules say once `change` is applied: the first problem, or ''."""
    document = _merged(spec.model_dump(mode="json", by_alias=True, exclude_none=True), change.patch)
    try:
        JobSpec.model_validate(document)
    except ValidationError as exc:
        problems = problems_from_validation_error(exc, prefix="spec")
        return f"; then also {problems[0]}" if problems else ""
    return ""


def gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def need(estimate: Estimate, placement: Placement, *, host: bool = False) -> str:
    if placement.on_gpu and host:
        return f"~{gib(estimate.gpu)} GiB GPU + {gib(estimate.host)} GiB host"
    return f"~{gib(estimate.gpu if placement.on_gpu else estimate.host)} GiB"


def _say(
    spec: JobSpec, change: Change, estimate: Estimate, placement: Placement, *, host: bool = False
) -> str:
    return (
        f"{' + '.join(change.settings)} ({need(estimate, placement, host=host)}){then_needed(spec, change)}"
    )


def gib_up(n: int) -> str:
    """GiB rounded up to a tenth: a bound that is never below the need it states."""
    return f"{math.ceil(n * 10 / GIB) / 10:.1f}"


def memory_quantity(n: int) -> str:
    """The smallest round Kubernetes quantity >= n bytes (Mi below 10 GiB, else Gi)."""
    if n < 10 * GIB:
        return f"{math.ceil(n / 2**20)}Mi"
    return f"{math.ceil(n / GIB)}Gi"


def bigger(role: str, smallest: Estimate, placement: Placement) -> str:
    if placement.on_gpu:
        return f"GPUs with >= {gib_up(smallest.gpu)} GiB"
    return f"roles.{role}.resources.memory >= {memory_quantity(smallest.host)}"


# ---------------------------------------------------------------------------------------- training


def training_fixes(role: str, job: Job, placement: Placement) -> list[str]:
    """For a learner or critic that does not fit."""
    spec = job.spec
    current = job.training_setup(role)
    shared = not placement.on_gpu
    micro_now = job.learner_micro(shared) if role == "learner" else job.critic_micro()

    def estimate(setup: TrainingSetup, micro: MicroBatch) -> Estimate:
        if role == "learner":  # fsdp learners need rollout workers of their own: none runs inside
            return workers.learner(job, placement, setup, micro, colocated_rollout=setup.shards == 1)
        return workers.critic(job, placement, setup, micro)

    def fitting(setup: TrainingSetup, micro: MicroBatch = micro_now) -> Estimate | None:
        e = estimate(setup, micro)
        return e if workers.fits_in(role, job, placement, e) else None

    def fsdp(setup: TrainingSetup, micro: MicroBatch) -> tuple[Change, TrainingSetup] | None:
        if not setup.trainable.full:
            return None  # fsdp shards whole-model training; the spec refuses it with LoRA
        n = _smallest(
            lambda k: fitting(dataclasses.replace(setup, shards=k), micro) is not None, setup.shards
        )
        if n is None:
            return None
        return _more_workers(job, role, placement, n), dataclasses.replace(setup, shards=n)

    checkpointing = Change(
        (f"roles.{role}.activationCheckpointing: true",), _role_patch(role, activationCheckpointing=True)
    )
    smaller = _smaller_micro_batches(role, job, shared)
    found: list[str] = []
    if not current.checkpointing and (e := fitting(dataclasses.replace(current, checkpointing=True))):
        found.append(_say(spec, checkpointing, e, placement))
    for change, micro in smaller:
        if e := fitting(current, micro):
            found.append(_say(spec, change, e, placement))
            break
    if role == "learner" and current.trainable.full:
        lora = dataclasses.replace(current, trainable=DEFAULT_LORA, shards=1, cpu_offload=False)
        if e := fitting(lora):
            patch: dict[str, Any] = {"model": {"lora": {}}}
            words = "model.lora: {} (rank 8 on q_proj, v_proj)"
            if current.shards > 1:
                patch = _merged(patch, _role_patch(role, sharding="ddp", cpuOffload=None))
                words += " with sharding: ddp"
            found.append(_say(spec, Change((words,), patch), e, placement))
    if sharded := fsdp(current, micro_now):
        change, setup = sharded
        found.append(_say(spec, change, estimate(setup, micro_now), placement))
    offload = current.trainable.full and not current.cpu_offload and placement.on_gpu
    replicas = getattr(spec.roles, role).replicas  # fsdp over the workers there are
    if offload and (e := fitting(dataclasses.replace(current, cpu_offload=True, shards=replicas))):
        patch = _role_patch(role, sharding="fsdp", cpuOffload=True)
        words = f"roles.{role}.cpuOffload: true" + ("" if current.shards > 1 else " with sharding: fsdp")
        found.append(_say(spec, Change((words,), patch), e, placement, host=True))
    if found:
        return found
    # Nothing alone: checkpointing with the largest micro-batch that then fits; else with the smallest
    # micro-batch, fsdp over the fewest learners that fit, or LoRA (the learner).
    change, setup = Change(), current
    if not setup.checkpointing:
        change, setup = checkpointing, dataclasses.replace(setup, checkpointing=True)
    for step, micro in smaller:
        if e := fitting(setup, micro):
            return [_say(spec, change + step, e, placement)]
    last, micro = smaller[-1] if smaller else (Change(), micro_now)
    combined = []
    if sharded := fsdp(setup, micro):
        step, sharded_setup = sharded
        combined.append(_say(spec, change + last + step, estimate(sharded_setup, micro), placement))
    if role == "learner" and setup.trainable.full:
        lora = dataclasses.replace(setup, trainable=DEFAULT_LORA, shards=1, cpu_offload=False)
        lora_change = Change(("model.lora: {}",), {"model": {"lora": {}}})
        if setup.shards > 1:
            lora_change += Change(("sharding: ddp",), _role_patch(role, sharding="ddp", cpuOffload=None))
        for step, small in [(Change(), micro_now), *smaller]:
            if e := fitting(lora, small):
                combined.append(_say(spec, change + step + lora_change, e, placement))
                break
    if combined:
        return combined
    # The memory that fits the job as written (a bound under it would need settings it does not name).
    return [bigger(role, estimate(current, micro_now), placement) + " (no setting fits it on this one)"]


def _more_workers(job: Job, role: str, placement: Placement, n: int) -> Change:
    """fsdp over `n` workers of `role`; with node pools, the pool being checked takes the extra ones."""
    spec_role = getattr(job.spec.roles, role)
    words = f"roles.{role}.sharding: fsdp over {n} {role}s"
    patch = _role_patch(role, sharding="fsdp", replicas=n)
    if placement.pool is not None:
        pools = [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in spec_role.node_pools]
        index = next(i for i, p in enumerate(spec_role.node_pools) if p.name == placement.pool)
        pools[index]["replicas"] += n - spec_role.replicas
        words += f" (nodePools[{index}].replicas: {pools[index]['replicas']})"
        patch = _role_patch(role, sharding="fsdp", replicas=n, nodePools=pools)
    return Change((words,), patch)


def _smallest(fits: Callable[[int], bool], current: int) -> int | None:
    """The fewest workers (more than `current`) whose shards fit; the estimate only shrinks with more."""
    low = max(current + 1, 2)
    if not fits(MAX_SHARDS):
        return None
    high = MAX_SHARDS
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _smaller_micro_batches(role: str, job: Job, shared: bool) -> list[tuple[Change, MicroBatch]]:
    """Smaller micro-batches, largest first, each with its setting. The learner: fewer prompts
    (training.microbatchSize, a divisor of the mini-batch), then fewer samples of one prompt
    (training.microbatchTokens, whose packing splits a group); a critic: fewer rows."""
    training = job.spec.training
    if role != "learner":
        now = job.critic_micro().rows
        return [
            (
                Change((f"roles.{role}.microbatchSize: {k}",), _role_patch(role, microbatchSize=k)),
                job.critic_micro(k),
            )
            for k in range(now - 1, 0, -1)
        ]
    out: list[tuple[Change, MicroBatch]] = []
    p, r, g = job.prompt_tokens, job.response_tokens, job.group
    now = job.learner_micro(shared)
    if training.microbatch_tokens is None:
        mini = training.minibatch_size or training.batch_size
        size = training.microbatch_size or mini
        for k in range(size - 1, 0, -1):
            if mini % k == 0:
                change = Change((f"training.microbatchSize: {k}",), {"training": {"microbatchSize": k}})
                out.append((change, job.learner_micro(shared, size=k)))
        rows = g // 2
    else:
        budget = training.microbatch_tokens // 2
        while now.prompts > 1 and budget >= p + g * max(r - 1, 0):
            micro = job.learner_micro(shared, tokens=budget)
            if micro.prompts < now.prompts:
                out.append(
                    (
                        Change(
                            (f"training.microbatchTokens: {budget}",),
                            {"training": {"microbatchTokens": budget}},
                        ),
                        micro,
                    )
                )
            budget //= 2
        rows = (now.rows if now.prompts == 1 else g) // 2
    while rows >= 1:  # a token budget that packs `rows` samples of one prompt
        budget = p + rows * max(r - 1, 1)
        words = f"training.microbatchTokens: {budget} ({rows} sample{'s' if rows > 1 else ''} a micro-batch)"
        patch = {"training": {"microbatchTokens": budget, "microbatchSize": None}}
        out.append((Change((words,), patch), job.learner_micro(shared, tokens=budget)))
        rows //= 2
    return out


# ---------------------------------------------------------------------------------- serving roles


def rollout_fixes(job: Job, placement: Placement) -> list[str]:
    """Tensor parallelism over more GPUs (vLLM), else a smaller rollout batch, else bigger GPUs."""
    found = []
    shape = job.shapes["rollout"]
    if job.spec.roles.rollout.backend_kind.tensor_parallel and placement.on_gpu:
        for tp in TENSOR_PARALLEL:
            if tp > max(placement.gpus, 1) and shape.heads % tp == 0:
                e = workers.rollout(job, placement, tensor_parallel=tp)
                if workers.fits_in("rollout", job, placement, e):
                    found.append(_gpus_fix(job, placement, tp, e))
                    break
    for smaller in range(job.spec.rollout_batch_size - 1, 0, -1):
        e = workers.rollout(job, placement, batch=smaller)
        change = Change((f"roles.rollout.batchSize: {smaller}",), _role_patch("rollout", batchSize=smaller))
        if workers.fits_in("rollout", job, placement, e) and not then_needed(job.spec, change):
            found.append(_say(job.spec, change, e, placement))
            break
    return found or [bigger("rollout", workers.rollout(job, placement, batch=1), placement)]


def _gpus_fix(job: Job, placement: Placement, tp: int, estimate: Estimate) -> str:
    role = job.spec.roles.rollout
    if placement.pool is not None:
        index = next(i for i, p in enumerate(role.node_pools) if p.name == placement.pool)
        pools = [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in role.node_pools]
        pools[index] = _merged(pools[index], {"resources": {"gpus": tp}})
        words = f"roles.rollout.nodePools[{index}].resources.gpus: {tp}"
        patch = _role_patch("rollout", nodePools=pools)
    else:
        words = f"roles.rollout.resources.gpus: {tp}"
        patch = _role_patch("rollout", resources={"gpus": tp})
    then = then_needed(job.spec, Change((words,), patch))
    return f"{words} (tensor parallel; {need(estimate, placement)} per GPU){then}"


def scoring_fixes(role: str, job: Job, placement: Placement, build: Callable[[int], Estimate]) -> list[str]:
    """A reference or reward worker: fewer rows per forward, else bigger GPUs."""
    spec_role = getattr(job.spec.roles, role)
    rows = spec_role.microbatch_size or job.spec.training.microbatch_size or 8
    for smaller in range(rows - 1, 0, -1):
        e = build(smaller)
        if workers.fits_in(role, job, placement, e):
            change = Change(
                (f"roles.{role}.microbatchSize: {smaller}",), _role_patch(role, microbatchSize=smaller)
            )
            return [_say(job.spec, change, e, placement)]
    return [bigger(role, build(1), placement)]
