"""A GPU worker's pod carries what the worker needs to find its device and talk NCCL: its GPUs requested,
NCCL's interface (overridable through the role's podTemplate), and a memory /dev/shm sized for NCCL; a
CPU worker's pod, and a GPU-given worker its spec keeps on the CPU, get none of it."""

from __future__ import annotations

from typing import Any

from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.spec.pod_security import violations
from dverl_operator.objects import owned, quantity
from dverl_operator.pods.gpu import NCCL_DEFAULT_INTERFACE, NCCL_INTERFACE, SHM_PER_GPU_MIB
from dverl_operator.reconcile.desired import for_job
from tests.support.operator_fixtures import tiny_spec


def pods(**roles: Any) -> dict[str, dict[str, Any]]:
    spec = parse_spec(tiny_spec(roles={"rollout": {"replicas": 2}, "learner": {"replicas": 1}, **roles}))
    return for_job(owned.Owner("j", "ns", "uid"), spec, plan_job(spec, "j"), "img:1").pods


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def shm_mib(pod: dict[str, Any]) -> int:
    dshm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"]["medium"] == "Memory"
    return int(quantity.parse(dshm["emptyDir"]["sizeLimit"]) // 2**20)


def test_a_gpu_learner_pod_gets_nccl_settings_and_a_large_shm() -> None:
    built = pods(learner={"replicas": 2, "resources": {"gpus": 2, "memory": "8Gi"}})
    learner = built["j-learner-1"]
    container = learner["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert env(learner)[NCCL_INTERFACE] == NCCL_DEFAULT_INTERFACE
    assert env(learner)["LOCAL_RANK"] == "0"  # the worker picks among the GPUs the device plugin gave
    assert shm_mib(learner) >= 2 * SHM_PER_GPU_MIB
    assert not violations(learner)


def test_cpu_workers_get_no_gpu_additions() -> None:
    built = pods(learner={"replicas": 1, "resources": {"gpus": 1}, "device": "cpu"})
    for pod in built.values():
        assert NCCL_INTERFACE not in env(pod)
        assert shm_mib(pod) < SHM_PER_GPU_MIB


def test_the_role_template_sets_nccls_interface() -> None:
    template = {"spec": {"env": [{"name": NCCL_INTERFACE, "value": "ib0"}]}}
    built = pods(learner={"replicas": 1, "resources": {"gpus": 1}, "podTemplate": template})
    assert env(built["j-learner-0"])[NCCL_INTERFACE] == "ib0"
