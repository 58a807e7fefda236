"""The test world's minimal Kueue, pure: its webhook gates only queue-labelled pods, and a pod group's
Workload is admitted (every member's gate lifted) only once all its pods exist."""

from __future__ import annotations

from typing import Any

from tests.support import kueue_standin as kueue


def pod(name: str, queue: str | None = "team-a", group: str | None = "g", total: int = 2) -> dict[str, Any]:
    labels = {}
    if queue is not None:
        labels[kueue.QUEUE_LABEL] = queue
    if group is not None:
        labels[kueue.GROUP_LABEL] = group
    meta = {"name": name, "labels": labels, "annotations": {kueue.TOTAL_ANNOTATION: str(total)}}
    made = {"metadata": meta, "spec": {"schedulingGates": [{"name": "other.io/gate"}]}}
    kueue.gate(made)
    return made


def names(pods: list[Any]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def test_only_a_queue_labelled_pod_is_gated_and_other_gates_stay() -> None:
    queued, plain = pod("a"), pod("b", queue=None)
    assert kueue.gated(queued) and not kueue.gated(plain)
    kueue.gate(queued)  # a second pass adds no second gate
    assert [g["name"] for g in queued["spec"]["schedulingGates"]] == ["other.io/gate", kueue.GATE]
    assert kueue.ungated(queued) == [{"name": "other.io/gate"}]


def test_a_group_is_admitted_whole_once_all_its_pods_exist() -> None:
    first = pod("a", total=3)
    assert kueue.admitted([first]) == []
    second, third = pod("b", total=3), pod("c", total=3)
    assert kueue.admitted([first, second]) == []
    assert names(kueue.admitted([first, second, third])) == ["a", "b", "c"]
    other = pod("x", group="h", total=2)
    assert names(kueue.admitted([first, second, third, other])) == ["a", "b", "c"]  # its group waits
    alone = pod("solo", group=None)
    assert names(kueue.admitted([alone])) == ["solo"]  # a pod of no group is a Workload of its own
    going = pod("d", total=1)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert kueue.admitted([going]) == []
    admitted_already = pod("e", total=1)
    admitted_already["spec"]["schedulingGates"] = kueue.ungated(admitted_already)
    assert kueue.admitted([admitted_already]) == []
