"""`dverl plan`'s output: a table a person reads (GiB per component, per role and pool) and the same plan
as JSON for machines."""

from __future__ import annotations

from typing import Any

from decentralized_verl.planning.devices import GIB
from decentralized_verl.planning.fit import MemoryPlan, WorkerPlan
from decentralized_verl.planning.memory import Component
from decentralized_verl.planning.shapes import ModelShape

COLUMNS = ("weights", "gradients", "optimizer", "activations", "logits", "kv cache")
SHORT = {"gradients": "grads", "optimizer": "optim", "activations": "activ", "kv cache": "kv"}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f}"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _device_of(worker: WorkerPlan) -> str:
    return "gpu" if worker.placement.on_gpu else "host"


def _row(worker: WorkerPlan) -> list[str]:
    device = _device_of(worker)
    on_device = [c for c in worker.estimate.components if c.device == device]
    by_name: dict[str, int] = {}
    for c in on_device:
        key = c.name if c.name in COLUMNS else "other"
        by_name[key] = by_name.get(key, 0) + c.bytes
    p = worker.placement
    if device == "gpu":
        need, have = worker.estimate.gpu, worker.gpu_budget
        source = p.gpu.source if p.gpu else ""
        if p.gpu is not None and p.gpu.bytes is not None and have is not None and have < p.gpu.bytes:
            source = f"{have / p.gpu.bytes:.2g} x {source}"  # the vLLM engine's share
        capacity = f"{_gib(have)} ({source})"
    else:
        need, have = worker.estimate.host, worker.host_budget
        capacity = f"{_gib(have)} ({p.host.source})"
    cells = [
        worker.role,
        p.pool or "-",
        str(p.replicas),
        device if device == "host" else f"gpu x{max(p.gpus, 1)}",
        *(_gib(by_name[name]) if name in by_name else "-" for name in (*COLUMNS, "other")),
        _gib(need),
        capacity,
        worker.verdict,
    ]
    return cells


HEADER = [
    "role",
    "pool",
    "n",
    "on",
    *(SHORT.get(c, c) for c in COLUMNS),
    "other",
    "peak",
    "capacity",
    "verdict",
]


def render(plan: MemoryPlan) -> str:
    """The plan as a text table in GiB (peak: what is always held plus the largest phase), then each
    worker group that does not fit with its fixes, then what was not checked."""
    lines: list[str] = []
    roles_of: dict[ModelShape, list[str]] = {}
    for role, shape in plan.shapes:
        roles_of.setdefault(shape, []).append(role)
    for shape, roles in roles_of.items():
        lines.append(
            f"{', '.join(roles)}: {_count(shape.parameters())} params, {shape.layers} layers, hidden "
            f"{shape.hidden}, {shape.heads}/{shape.kv_heads} heads, vocab {shape.vocab} ({shape.source})"
        )
    rows = [HEADER, *(_row(w) for w in plan.workers)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    if lines:
        lines.append("")
    for k, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(widths[i]) if i < 4 else cell.rjust(widths[i]) for i, cell in enumerate(row)
            ).rstrip()
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("GiB per worker; peak: what is always held + the largest phase (details: --json)")
    lines.extend(_inside_lines(plan))
    for worker in plan.workers:
        if worker.problem is not None:
            lines.append("")
            lines.append(f"{worker.problem.path}: {worker.reason}")
            lines.extend(f"  fix: {fix}" for fix in worker.fixes)
    for note in plan.notes:
        lines.append(note)
    return "\n".join(lines)


def _inside_lines(plan: MemoryPlan) -> list[str]:
    """Which roles run inside another's process (replicas 0), and what a 4-bit base means for the rows."""
    out = []
    seen: set[str] = set()
    for worker in plan.workers:
        inside = sorted({c.phase.split(" ", 1)[0] for c in worker.estimate.components if " " in c.phase})
        if inside and worker.role not in seen:
            seen.add(worker.role)
            out.append(f"{worker.role} also runs {', '.join(inside)} in its own process (replicas: 0)")
    if plan.spec is not None and plan.spec.model.quantization is not None:
        q = plan.spec.model.quantization
        dq = ", double-quantized scales" if q.double_quant else ""
        out.append(
            f"model.quantization: the base in 4 bits ({q.type}{dq}); the LoRA reference is that base with "
            "the adapters off (no weights of its own); other includes one dequantized layer"
        )
    return out


def _component(c: Component) -> dict[str, Any]:
    return {
        "name": c.name,
        "bytes": c.bytes,
        "gib": round(c.bytes / GIB, 3),
        "device": c.device,
        "phase": c.phase,
        "detail": c.detail,
    }


def to_json(plan: MemoryPlan) -> dict[str, Any]:
    return {
        "fits": not plan.problems(),
        "shapes": {
            role: {
                "parameters": shape.parameters(),
                "layers": shape.layers,
                "hidden": shape.hidden,
                "intermediate": shape.intermediate,
                "heads": shape.heads,
                "kvHeads": shape.kv_heads,
                "headDim": shape.head_dim,
                "vocab": shape.vocab,
                "tiedEmbeddings": shape.tied_embeddings,
                "source": shape.source,
            }
            for role, shape in plan.shapes
        },
        "workers": [
            {
                "role": w.role,
                "pool": w.placement.pool,
                "field": w.placement.field,
                "replicas": w.placement.replicas,
                "gpus": w.placement.gpus,
                "onGpu": w.placement.on_gpu,
                "gpuPeakBytes": w.estimate.gpu,
                "hostPeakBytes": w.estimate.host,
                "gpuCapacityBytes": w.gpu_budget,
                "hostCapacityBytes": w.host_budget,
                "capacitySource": w.placement.gpu.source if w.placement.gpu else w.placement.host.source,
                "verdict": w.verdict,
                "reason": w.reason,
                "fixes": list(w.fixes),
                "components": [_component(c) for c in w.estimate.components],
            }
            for w in plan.workers
        ],
        "spans": _spans(plan),
        "problems": [{"field": p.path, "message": p.message} for p in plan.problems()],
        "notes": list(plan.notes),
    }


def _spans(plan: MemoryPlan) -> dict[str, Any] | None:
    """The rollout's span chain as planned: the spec's own setting, or the count the planner chose."""
    spans = plan.spec.roles.rollout.spans if plan.spec is not None else None
    if spans is None:
        return None
    chosen = plan.chosen_spans is not None
    return {
        "count": spans.count,
        "replicas": spans.replicas,
        "chosenByPlanner": chosen,
        "reason": plan.span_choice.words() if chosen and plan.span_choice is not None else "",
    }
