"""The harness's GPU pool nodes, pure: what such a node advertises, where the scheduler emulation places
the GPU-sized examples' pods among pools (nodeSelector, the GPU taint against tolerations, GPU counts),
what a container that asked for GPUs gets in a device plugin's stead, and which nodes hold the CUDA
`-vllm` image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.node_harness.gpus import DEVICE_ENV, GPU, GPU_TAINT, device_env, gpu_node, plays_gpus
from tests.support.node_harness.image import VLLM_CPU_IMAGE, VLLM_CUDA_IMAGE, ImageStandIn, node_images
from tests.support.node_harness.scheduling import NodeInfo, choose

TOLERATE = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
POOLS = [
    gpu_node("a100-0", 2, {"gpu": "a100"}, tainted=True),
    gpu_node("rtx4090-0", 2, {"gpu": "rtx4090"}),
    gpu_node("l40s-0", 2, {"gpu": "l40s"}),
]


def pod(name: str, gpus: int = 1, pool: str | None = None, tolerate: bool = False, memory: str = "64Gi"):
    """A worker pod in the shape the operator renders for a role on a pool."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "worker", "resources": {"limits": {GPU: str(gpus), "memory": memory}}},
        ]
    }
    if pool is not None:
        spec["nodeSelector"] = {"gpu": pool}
    if tolerate:
        spec["tolerations"] = TOLERATE
    return {"metadata": {"name": name, "uid": name}, "spec": spec, "status": {}}


def place(pods: list[dict[str, Any]], nodes: list[NodeInfo]) -> dict[str, str | None]:
    """Each pod's node in order, as the scheduler binds one after another (None: unschedulable)."""
    bound: dict[str, list[dict[str, Any]]] = {n.name: [] for n in nodes}
    where: dict[str, str | None] = {}
    for p in pods:
        node, _ = choose(p, nodes, bound)
        where[p["metadata"]["name"]] = node
        if node is not None:
            bound[node].append(p)
    return where


def test_a_gpu_node_advertises_its_gpus_labels_taint_and_a_declared_memory() -> None:
    node = gpu_node("a100-0", 4, {"gpu": "a100"}, tainted=True)
    assert node.allocatable[GPU] == "4" and node.labels == {"gpu": "a100"}
    assert list(node.taints) == [GPU_TAINT]
    assert node.amount("memory") >= 8 * 128 * 2**30  # the 7B example's learners: 128Gi each, declared
    assert gpu_node("b", 1, {}).taints == [] and plays_gpus(node)
    assert not plays_gpus(NodeInfo("plain"))
    with pytest.raises(ValueError, match="at least one GPU"):
        gpu_node("none", 0, {})


def test_dapo_math_pods_go_to_their_pools_and_the_learners_avoid_the_tainted_node() -> None:
    pods = [
        pod("r-a100-0", pool="a100", tolerate=True),
        pod("r-a100-1", pool="a100", tolerate=True),
        pod("r-rtx-0", pool="rtx4090"),
        pod("r-rtx-1", pool="rtx4090"),
        pod("learner-0"),
        pod("learner-1"),
    ]
    where = place(pods, POOLS)
    assert where == {
        "r-a100-0": "a100-0", "r-a100-1": "a100-0", "r-rtx-0": "rtx4090-0", "r-rtx-1": "rtx4090-0",
        "learner-0": "l40s-0", "learner-1": "l40s-0",
    }  # fmt: skip


def test_a_pool_pod_waits_with_the_schedulers_reasons_when_its_pool_cannot_take_it() -> None:
    untolerating = pod("r", pool="a100")  # the a100 pool is tainted: a selector alone is not enough
    node, message = choose(untolerating, POOLS, {})
    assert node is None
    assert message == (
        "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: }."
    )
    full = {"rtx4090-0": [pod("x", 2, pool="rtx4090")]}
    node, message = choose(pod("r", pool="rtx4090"), POOLS, full)
    assert node is None and "1 Insufficient nvidia.com/gpu" in message, message
    node, message = choose(pod("big", gpus=3), POOLS, {})
    assert node is None and "2 Insufficient nvidia.com/gpu" in message, message


def test_only_a_container_that_asked_for_gpus_on_a_gpu_node_gets_the_cpu_override() -> None:
    worker = pod("w")["spec"]["containers"][0]
    helper = {"name": "init", "resources": {"limits": {"memory": "1Gi"}}}
    zero = {"name": "z", "resources": {"requests": {GPU: "0"}}}
    assert device_env(POOLS[0], worker) == DEVICE_ENV == {"DVERL_DEVICE": "cpu"}
    assert device_env(POOLS[0], helper) == {} and device_env(POOLS[0], zero) == {}
    assert device_env(NodeInfo("plain"), worker) == {}


def test_the_cuda_vllm_image_is_held_only_by_a_gpu_node_with_a_vllm_venv(tmp_path: Path) -> None:
    plain = ImageStandIn()
    venv = tmp_path / "venv-vllm"
    assert VLLM_CUDA_IMAGE not in node_images(plain, venv)  # a CPU node: its pods wait on the pull
    assert VLLM_CUDA_IMAGE not in node_images(plain, None, gpus=True)
    images = node_images(plain, venv, gpus=True)
    assert images[VLLM_CUDA_IMAGE].venv == venv == images[VLLM_CPU_IMAGE].venv
    assert VLLM_CUDA_IMAGE.endswith("-vllm") and images[VLLM_CUDA_IMAGE].files == plain.files
