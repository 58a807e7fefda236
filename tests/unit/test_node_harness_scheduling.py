"""The test node's scheduler, pure: where a pod fits, and the scheduler's message when it fits nowhere;
probe settings as the kubelet reads them."""

from __future__ import annotations

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
