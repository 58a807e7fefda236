"""A harness node that plays a node of a GPU node pool: it advertises `nvidia.com/gpu` allocatable, carries
the pool's labels (`gpu: a100`) and, where the pool is tainted, the `nvidia.com/gpu:NoSchedule` taint, so
the scheduler (scheduling.py) places pods on it by their nodeSelector, tolerations and GPU requests as
kube-scheduler does. The machine has no GPU: where a real node's device plugin hands a container that
asked for GPUs its devices, this node hands it `DVERL_DEVICE=cpu`, the worker's own device override
(runtime/device.py through cluster_worker.worker_device), so the worker computes on the CPU in the GPU's
stead. Its memory capacity is declared, not real: large enough for the GPU-sized examples' requests
(64Gi, 128Gi a worker), which the machine does not have. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.support.api_server.admission import container_amount
from tests.support.node_harness.scheduling import NodeInfo

GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "", "effect": "NoSchedule"}
"""The taint GPU node pools commonly carry (GKE and the NVIDIA GPU operator put it on GPU nodes), so only
pods that tolerate it land there."""
DEVICE_ENV = {"DVERL_DEVICE": "cpu"}
"""What a container that asked for GPUs gets on such a node in the device plugin's stead."""


def gpu_node(
    name: str,
    gpus: int,
    labels: Mapping[str, str],
    tainted: bool = False,
    memory: str = "2Ti",
    cpu: str = "256",
    pods: int = 110,
) -> NodeInfo:
    """A node of a GPU pool as the scheduler sees it: `gpus` GPUs, the pool's `labels`, the GPU taint when
    `tainted`, and a declared (not real) memory and cpu capacity."""
    if gpus < 1:
        raise ValueError(f"a GPU node has at least one GPU (got {gpus})")
    allocatable = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU: str(gpus)}
    return NodeInfo(name, allocatable, dict(labels), taints=[GPU_TAINT] if tainted else [])


def plays_gpus(node: NodeInfo) -> bool:
    """The node advertises GPUs (it is a GPU pool's node)."""
    return node.amount(GPU) > 0


def device_env(node: NodeInfo, container: Mapping[str, Any]) -> dict[str, str]:
    """What the node adds to a container's environment in the device plugin's stead: the CPU override for
    a container that asked for GPUs on a node that advertises them; nothing otherwise."""
    asked = container_amount(container, "requests", GPU)
    return dict(DEVICE_ENV) if plays_gpus(node) and asked else {}
