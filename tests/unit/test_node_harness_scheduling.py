"""The test node's scheduler, pure: where a pod fits, and the scheduler's message when it fits nowhere;
probe settings as the kubelet reads them."""

from __future__ import annotations

from tests.support.node_harness import gangs
from tests.support.node_harness.probes import port_of, probe_spec
from tests.support.node_harness.scheduling import NodeInfo, choose, tolerates, why_not

GPU = NodeInfo("gpu", {"cpu": "8", "memory": "32Gi", "pods": "3", "nvidia.com/gpu": "2"}, {"pool": "gpu"})
CPU = NodeInfo("cpu", {"cpu": "8", "memory": "32Gi", "pods": "3"}, {"pool": "cpu"})
TAINTED = NodeInfo("t", {"cpu": "8", "memory": "32Gi", "pods": "3", "nvidia.com/gpu": "8"},
                   taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])  # fmt: skip


def pod(gpus: int = 0, cpu: str = "1", memory: str = "1Gi", **spec) -> dict:
    limits = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], **spec},
    }


def test_a_pod_goes_where_its_gpus_fit() -> None:
    assert choose(pod(gpus=2), [CPU, GPU], {}) == ("gpu", "")
    node, message = choose(pod(gpus=3), [CPU, GPU], {})
    assert node is None and message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert choose(pod(gpus=1), [GPU], {"gpu": [pod(gpus=2)]})[0] is None
    finished = {**pod(gpus=2), "status": {"phase": "Succeeded"}}
    assert choose(pod(gpus=1), [GPU], {"gpu": [finished]})[0] == "gpu"  # a finished pod frees its GPUs


def test_each_node_says_the_first_filter_it_fails() -> None:
    assert why_not(pod(gpus=1), TAINTED, []) == ["node(s) had untolerated taint {gpu: yes}"]
    assert why_not(pod(nodeSelector={"pool": "gpu"}), CPU, []) == [
        "node(s) didn't match Pod's node affinity/selector"
    ]
    assert why_not(pod(gpus=4, cpu="9", memory="64Gi"), GPU, []) == [
        "Insufficient cpu", "Insufficient memory", "Insufficient nvidia.com/gpu",
    ]  # fmt: skip
    assert why_not(pod(), CPU, [pod(), pod(), pod()]) == ["Too many pods"]
    _, message = choose(pod(gpus=3), [CPU, GPU, TAINTED], {})
    assert message == (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {gpu: yes}."
    )


def test_tolerations_match_as_the_scheduler_matches_them() -> None:
    taint = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
    assert tolerates([{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}], taint)
    assert tolerates([{"key": "gpu", "operator": "Exists"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)
    assert not tolerates([{"key": "gpu", "value": "no"}], taint)
    assert not tolerates([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], taint)
    ok = pod(gpus=1, tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert choose(ok, [TAINTED], {})[0] == "t"


def test_the_least_loaded_fitting_node_wins() -> None:
    twin = NodeInfo("twin", GPU.allocatable, GPU.labels)
    assert choose(pod(), [GPU, twin], {"gpu": [pod(cpu="4")]})[0] == "twin"


def test_probe_settings_default_as_the_kubelet_does() -> None:
    spec = probe_spec({"httpGet": {"path": "/", "port": "http"}})
    assert spec is not None
    assert (spec.period, spec.timeout, spec.success_threshold, spec.failure_threshold) == (10.0, 1.0, 1, 3)
    assert probe_spec({}) is None and probe_spec({"periodSeconds": 1}) is None
    container = {"ports": [{"name": "http", "containerPort": 8080}]}
    assert (
        port_of(container, "http") == 8080 and port_of(container, 9) == 9 and port_of(container, "x") is None
    )


def member(name: str, gpus: int = 0, scheduler: str = "coscheduling") -> dict:
    marks = (
        {"labels": {gangs.COSCHEDULING_LABEL: "job"}}
        if scheduler == "coscheduling"
        else {"annotations": {gangs.VOLCANO_ANNOTATION: "job"}}
    )
    return {**pod(gpus=gpus), "metadata": {"name": name, "namespace": "ns", **marks}}


def group(min_member: int, timeout: int | None = None) -> dict:
    return {"spec": {"minMember": min_member, **({"scheduleTimeoutSeconds": timeout} if timeout else {})}}


def place(members: list[dict], group_body: dict | None, waited_s: float = 0.0, live: int | None = None):
    key = gangs.gang_of(members[0])
    return gangs.place(
        key, group_body, members, len(members) if live is None else live, {"gpu": []},
        lambda p, trial: choose(p, [GPU], trial), waited_s,
    )  # fmt: skip


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    assert gangs.gang_of(member("a")) == ("coscheduling", "ns", "job")
    assert gangs.gang_of(member("a", scheduler="volcano")) == ("volcano", "ns", "job")
    assert gangs.gang_of(pod()) is None
    fits = place([member("a", gpus=1), member("b", gpus=1)], group(2))
    assert fits.nodes == {"a": "gpu", "b": "gpu"} and fits.unplaced == {}
    # Each fits alone; together they need 3 of the node's 2 GPUs: neither is placed. The one that
    # fits waits at Permit without a word until the group's timeout, then is rejected.
    members = [member("a", gpus=1), member("b", gpus=2)]
    waiting = place(members, group(2, timeout=5), waited_s=1.0)
    assert waiting.nodes == {} and waiting.unplaced == {
        "a": None, "b": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    }  # fmt: skip
    late = place(members, group(2, timeout=5), waited_s=5.0)
    assert late.unplaced["a"] == "rejected due to timeout after waiting 5s at plugin Coscheduling"
    assert [gangs.go_duration(s) for s in (1, 60, 61, 3600)] == ["1s", "1m0s", "1m1s", "1h0m0s"]
    # minMember 1: the member that fits goes, the other waits with its own reason.
    assert place(members, group(1)).nodes == {"a": "gpu"}


def test_a_gang_short_of_pods_or_without_its_group_waits_saying_so() -> None:
    short = place([member("a")], group(3))
    assert short.nodes == {} and short.unplaced == {
        "a": "pre-filter pod a cannot find enough sibling pods, current pods number: 1, minMember of group: 3"
    }  # fmt: skip
    assert place([member("a")], None).unplaced == {"a": 'podgroups "job" not found'}
    volcano = place([member("a", 1, "volcano"), member("b", 2, "volcano")], group(2))
    assert volcano.nodes == {} and volcano.unplaced["a"] == (
        "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"
    )
    # Already-placed members count toward minMember.
    assert place([member("b", gpus=1)], group(2), live=2).nodes == {"b": "gpu"}
