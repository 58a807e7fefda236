"""A minimal Kueue for the test world: its pod webhook holds every new pod that carries a queue label
behind Kueue's admission gate, and its admitter admits a pod group's Workload once all the group's pods
(its `pod-group-total-count`) exist, by lifting the gate from each of them. Enough for a job queued
through Kueue to be admitted and scheduled; not played: ClusterQueues, LocalQueues and their quota
(every queue admits at once), Workload objects, preemption and requeueing. The decisions are pure; `run`
is the loop that applies them to the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
GATE = "kueue.x-k8s.io/admission"


def gate(pod: dict[str, Any]) -> None:
    """Kueue's pod webhook: a new pod with a queue label waits behind the admission gate."""
    if QUEUE_LABEL in ((pod.get("metadata") or {}).get("labels") or {}):
        spec = pod.setdefault("spec", {})
        gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GATE]
        spec["schedulingGates"] = [*gates, {"name": GATE}]


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def admitted(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The gated pods whose Workload is admitted now: every pod of a group once the group has all its
    pods (a pod without a group is a Workload of its own)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    out: list[Mapping[str, Any]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or not gated(pod):
            continue
        group = (meta.get("labels") or {}).get(GROUP_LABEL)
        if group is None:
            out.append(pod)
        else:
            groups.setdefault((meta.get("namespace") or "default", group), []).append(pod)
    for members in groups.values():
        total = (members[0]["metadata"].get("annotations") or {}).get(TOTAL_ANNOTATION)
        if total is not None and total.isdigit() and len(members) >= int(total):
            out.extend(members)
    return out


def ungated(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's scheduling gates without Kueue's."""
    return [dict(g) for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != GATE]


async def _admit_forever(emulator: Any, poll_seconds: float) -> None:
    while True:
        pods = (await emulator.call("GET", "api/v1/pods"))["items"]
        for pod in admitted(pods):
            meta = pod["metadata"]
            with contextlib.suppress(AssertionError):  # gone meanwhile
                await emulator.call(
                    "PATCH", f"api/v1/namespaces/{meta.get('namespace') or 'default'}/pods/{meta['name']}",
                    {"spec": {"schedulingGates": ungated(pod) or None}}, "application/merge-patch+json",
                )  # fmt: skip
        await asyncio.sleep(poll_seconds)


@contextlib.asynccontextmanager
async def run(emulator: Any, poll_seconds: float = 0.5) -> AsyncIterator[None]:
    """Kueue installed in the emulator (`tests/support/operator_fixtures.Emulator`) for the block."""
    emulator.kmock.pod_webhooks.append(gate)
    task = asyncio.create_task(_admit_forever(emulator, poll_seconds))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        emulator.kmock.pod_webhooks.remove(gate)
