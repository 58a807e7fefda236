"""The scheduler's filter, pure: which harness nodes a pod fits (its declared nvidia.com/gpu, cpu,
memory and the node's pod count against what the node's bound pods already request, its nodeSelector,
the node's NoSchedule/NoExecute taints against its tolerations), and when none does, the scheduler's
message (`0/2 nodes are available: 2 Insufficient nvidia.com/gpu.`). Among nodes that fit, the least
requested one wins (the default scoring's spirit), then the name.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dverl_operator.objects.quantity import parse
from tests.support.api_server.admission import pod_amount

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeInfo:
    """A harness node as the scheduler sees it: name, allocatable amounts, labels, taints."""

    name: str
    allocatable: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "64", "memory": "256Gi", "pods": "110"}
    )
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()

    def amount(self, resource: str) -> Decimal:
        text = self.allocatable.get(resource)
        return parse(str(text)) if text is not None else Decimal(0)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    for t in tolerations:
        effect_ok = not t.get("effect") or t.get("effect") == taint.get("effect")
        if t.get("operator") == "Exists":
            key_ok = not t.get("key") or t.get("key") == taint.get("key")
            if key_ok and effect_ok:
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", "") and effect_ok:
            return True
    return False


def _taint_text(taint: Mapping[str, str]) -> str:
    return f"{{{taint.get('key')}: {taint.get('value', '')}}}"


def why_not(pod: Mapping[str, Any], node: NodeInfo, bound: Iterable[Mapping[str, Any]]) -> list[str]:
    """The scheduler's reasons `pod` cannot go on `node` (empty: it fits). As the scheduler's filters do,
    the first filter that fails gives the node's reasons, in the default order: taints, the node
    selector, then resources (every resource that is short)."""
    spec = pod.get("spec") or {}
    for taint in node.taints:
        untolerated = not tolerates(spec.get("tolerations") or [], taint)
        if taint.get("effect") in ("NoSchedule", "NoExecute") and untolerated:
            return [f"node(s) had untolerated taint {_taint_text(taint)}"]
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    reasons = []
    live = [p for p in bound if ((p.get("status") or {}).get("phase")) not in TERMINAL]
    if len(live) + 1 > node.amount("pods"):
        reasons.append("Too many pods")
    names = set(RESOURCES)
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        names |= set(resources.get("requests") or {}) | set(resources.get("limits") or {})
    for resource in sorted(names):
        asked = pod_amount(pod, "requests", resource)
        if not asked:
            continue
        used = sum((pod_amount(p, "requests", resource) or Decimal(0) for p in live), Decimal(0))
        if used + asked > node.amount(resource):
            reasons.append(f"Insufficient {resource}")
    return reasons


def choose(
    pod: Mapping[str, Any], nodes: Sequence[NodeInfo], bound: Mapping[str, Sequence[Mapping[str, Any]]]
) -> tuple[str | None, str]:
    """(the node to bind to, "") or (None, the scheduler's message)."""
    fitting = []
    counts: collections.Counter[str] = collections.Counter()
    for node in nodes:
        reasons = why_not(pod, node, bound.get(node.name, ()))
        if reasons:
            counts.update(reasons)
        else:
            load = sum(
                (pod_amount(p, "requests", "cpu") or Decimal(0) for p in bound.get(node.name, ())), Decimal(0)
            )
            fitting.append((load / max(node.amount("cpu"), Decimal(1)), node.name))
    if fitting:
        return min(fitting)[1], ""
    listed = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    return None, f"0/{len(nodes)} nodes are available: {listed}."
