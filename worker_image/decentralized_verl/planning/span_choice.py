"""The rollout's span layout a job runs with: the spec's `roles.rollout.spans` when set, else layer spans
the planner chooses itself when the model fits on no single rollout worker but does as a chain of spans
(docs/spans.md). Pure: the job's sizes and each rollout placement's memory in, a choice out.

The chosen count is written into the spec (`with_spans`) before any worker, pod or manifest is derived
from it, so the plan, the operator's span pods, the rollout worker's DVERL_SPAN_ADDRS, the span servers'
layers and the learner's per-span signed manifests all read one count.
"""

from __future__ import annotations

from dataclasses import dataclass

from decentralized_verl.planning import workers
from decentralized_verl.planning.devices import GIB, placements
from decentralized_verl.planning.spans import chain_estimate, smallest_chain
from decentralized_verl.planning.workers import Job
from decentralized_verl.spec import JobSpec


@dataclass(frozen=True)
class SpanChoice:
    """What the planner decided about serving the rollout as spans, and the numbers behind it."""

    count: int | None
    """Spans per rollout worker; None: the model fits as spans on no worker (refused)."""
    need: int
    """Bytes the whole model's rollout worker needs on its decisive device."""
    have: int
    """Bytes the smallest rollout worker has there."""
    heaviest: int
    """Bytes the chain's heaviest process needs: at `count` spans, or at one layer a span when None."""

    def words(self) -> str:
        """What `dverl plan` says: the chosen count and why, or (None) why spans do not help either."""
        if self.count is None:
            return f"even as spans of one layer each its heaviest process needs ~{_gib(self.heaviest)} GiB"
        return (
            f"rollout: the model needs ~{_gib(self.need)} GiB, a worker has {_gib(self.have)} GiB: served "
            f"as {self.count} spans (heaviest process ~{_gib(self.heaviest)} GiB; set roles.rollout.spans "
            "to choose otherwise)"
        )


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def choose_spans(job: Job) -> SpanChoice | None:
    """Spans for a job whose whole-model hf rollout workers do not fit their memory; None when the spec
    already says (`roles.rollout.spans`), when spans cannot serve the job (vLLM, LoRA, colocated), when
    its model's shape or a worker's memory is unknown, or when the whole model fits on every worker."""
    spec = job.spec
    role = spec.roles.rollout
    servable = role.backend_kind.layer_spans and role.replicas > 0 and spec.model.lora is None
    if role.spans is not None or not servable:
        return None
    if "rollout" not in job.shapes:
        return None
    shape, b = job.shapes["rollout"], job.dtype_bytes("rollout")
    whole = []
    for placement in placements("rollout", role):
        estimate = workers.rollout(job, placement)
        gpu, host = workers.budgets("rollout", job, placement)
        verdict = workers.fits(estimate, gpu, host, placement.on_gpu)
        if verdict is None:
            return None
        whole.append((placement, estimate, gpu if placement.on_gpu else host, verdict))
    short = [(p, e, have) for p, e, have, verdict in whole if not verdict]
    if not short:
        return None
    placement, estimate, have = min(short, key=lambda s: s[2] or 0)
    need = estimate.gpu if placement.on_gpu else estimate.host
    count = 0
    for p, _, _, _ in whole:  # every rollout worker's chain must fit its own pool
        gen = workers.generation(job, p)
        found = smallest_chain(shape, b, gen, p.on_gpu, lambda e, p=p: workers.fits_in("rollout", job, p, e))
        if found is None:
            one_layer = chain_estimate(shape, b, gen, p.on_gpu, shape.layers)
            heaviest = one_layer.gpu if p.on_gpu else one_layer.host
            return SpanChoice(None, need, have or 0, heaviest)
        count = max(count, found[0])
    chain = chain_estimate(shape, b, workers.generation(job, placement), placement.on_gpu, count)
    return SpanChoice(count, need, have or 0, chain.gpu if placement.on_gpu else chain.host)


def with_spans(spec: JobSpec, count: int) -> JobSpec:
    """`spec` with its rollout served as `count` spans of one server each, checked by the spec's rules."""
    document = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["roles"]["rollout"]["spans"] = {"count": count}
    return JobSpec.model_validate(document)
