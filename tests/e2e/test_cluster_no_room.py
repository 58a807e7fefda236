"""What a cluster does to a job that asks too much, shown live: the real operator on the strict API server
and the test node. A role whose memory limit is below what its worker needs is OOM-killed by the node's
memory cgroup (exit 137, OOMKilled), and the operator fails the job at once naming the role, the limit
and the planner's fix; a role asking for more GPUs than any node has stays Pending, and the job carries
the scheduler's words in its Unschedulable condition; a coscheduling gang that cannot be placed waits
Queued (WaitingForGang) past its scheduleTimeoutSeconds, as the operator's stated policy says (waiting is
not a failure: it stays until a node frees room or someone decides). The GPU-sized shipped examples,
applied as shipped, wait the same way (the one with a Volcano gang and a Kueue queue, Queued); on nodes
that play their GPU pools they run (tests/e2e/test_cluster_gpu_examples.py). One
cluster for all, to keep it short. The test node places a gang as the plugin does, all or nothing: the
gang's learner, which alone would fit, is not placed without its rollout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dverl_operator.status import conditions as cond
from tests.support.cluster_node import claims, cluster, cluster_spec, shipped
from tests.support.local_models import save_tiny_model
from tests.support.node_harness import refused
from tests.support.node_harness.cgroups import unavailable
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
LIMIT = "96Mi"
"""Far below what a worker process needs once torch is loaded (some hundreds of MiB). The model is a
folder on the data claim: the operator reads no user folders, so the planner cannot refuse the limit up
front (a model.tiny job with this limit is refused at validation: the planner knows its size), and the
kernel is what says no. The worker, which can read the folder, leaves the planner's estimate for its own
role as its termination message before torch loads, so the failure names that figure all the same."""


def too_small(data: Path) -> dict[str, Any]:
    save_tiny_model(data / "toy" / "models" / "tiny")  # the claim's `toy/` is mounted at /data
    spec = cluster_spec(steps=2)
    spec["model"] = {"path": "/data/models/tiny", "dtype": "float32"}
    spec["roles"]["learner"]["resources"] = {**spec["roles"]["learner"].get("resources", {}), "memory": LIMIT}
    return spec


def gpu_hungry() -> dict[str, Any]:
    spec = cluster_spec(steps=2)
    spec["roles"]["rollout"]["resources"] = {**spec["roles"]["rollout"].get("resources", {}), "gpus": 1}
    return spec


GPU_SIZED = ("dapo-math", "qwen7b-grpo-fsdp", "qwen7b-grpo-lora-consumer")
"""Shipped examples whose roles ask for GPUs (and the 7B ones for GPU node pools): applied as shipped, cut
short, they wait with the scheduler's reason."""
KUEUE_QUEUED = ("qwen7b-grpo-shared-cluster",)
"""Admitted through a Kueue LocalQueue (and a Volcano gang): its pods wait gated."""


def gang_of(spec: dict[str, Any]) -> dict[str, Any]:
    """All of the job's pods placed together or not at all, the coscheduling gang retried after 1 s."""
    return {**spec, "scheduling": {"gang": {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 1}}}


async def test_an_oom_killed_role_and_an_unplaceable_one_end_in_statuses_that_name_the_cause(
    tmp_path: Path,
) -> None:
    oom_refused = unavailable()
    volumes = claims(tmp_path)
    volumes["models"] = tmp_path / "claims" / "models"
    volumes["models"].mkdir()
    gangs = ("gangScheduling.coscheduling=true", "gangScheduling.volcano=true")
    flags = ("--gang-schedulers", "coscheduling,volcano")
    async with cluster(tmp_path, volumes, *flags, chart_values=gangs) as (emu, node, op):
        await emu.create_job("hungry", gpu_hungry())
        await emu.create_job("gang", gang_of(gpu_hungry()))
        for example in GPU_SIZED + KUEUE_QUEUED:
            labels = {"kueue.x-k8s.io/queue-name": "team-a"} if example in KUEUE_QUEUED else None
            await emu.create_job(example.replace("qwen7b-grpo-", "q-"), shipped(example), labels=labels)
        if oom_refused is None:
            await emu.create_job("small", too_small(volumes["rl-data"]))

        async def unschedulable() -> dict[str, Any] | None:
            status = ((await emu.job("hungry")) or {}).get("status") or {}
            found = cond.condition(status.get("conditions") or [], cond.UNSCHEDULABLE)
            return status if found is not None and found.get("status") == "True" else None

        async def failed() -> dict[str, Any] | None:
            status = ((await emu.job("small")) or {}).get("status") or {}
            return status if status.get("phase") == "Failed" else None

        try:
            hungry = await wait_for(
                unschedulable, timeout=120, interval=0.5, what="the Unschedulable condition"
            )
            small = (
                await wait_for(failed, timeout=200, interval=0.5, what="the OOM-killed job failed")
                if (oom_refused is None)
                else None
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{node.all_logs()[-5000:]}\n{op.log()[-3000:]}") from None

        async def queued() -> dict[str, Any] | None:
            status = ((await emu.job("gang")) or {}).get("status") or {}
            return status if status.get("phase") == "Queued" else None

        await wait_for(queued, timeout=60, interval=0.5, what="the gang Queued")

        async def examples_waiting() -> dict[str, dict[str, Any]] | None:
            found = {
                ex: ((await emu.job(ex.replace("qwen7b-grpo-", "q-"))) or {}).get("status") or {}
                for ex in GPU_SIZED + KUEUE_QUEUED
            }
            unplaced = all(
                cond.condition(found[ex].get("conditions") or [], cond.UNSCHEDULABLE) for ex in GPU_SIZED
            )
            gated = all(found[ex].get("phase") == "Queued" for ex in KUEUE_QUEUED)
            return found if unplaced and gated else None

        examples = await wait_for(examples_waiting, timeout=60, interval=0.5, what="the GPU examples waiting")
        await asyncio.sleep(3.0)  # past the gang's timeout, more passes: waiting is not failing
        still = ((await emu.job("hungry")) or {}).get("status") or {}
        gang = ((await emu.job("gang")) or {}).get("status") or {}
        gang_pods = await emu.pods("gang")
        events = [(e["reason"], e["message"]) for e in await emu.events()]

    said = cond.condition(hungry["conditions"], cond.UNSCHEDULABLE)
    assert said is not None and said["reason"] == "Unschedulable", hungry
    assert "pod hungry-rollout-" in said["message"] and "(rollout) cannot be scheduled" in said["message"]
    assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in said["message"], said
    assert still.get("phase") != "Failed", still
    assert any(r == "Unschedulable" and "Insufficient nvidia.com/gpu" in m for r, m in events), events

    for example in GPU_SIZED:  # as shipped: GPUs on GPU node pools the node does not have
        said = cond.condition(examples[example]["conditions"], cond.UNSCHEDULABLE)
        assert said is not None and "cannot be scheduled: 0/1 nodes are available: 1 " in said["message"]
        assert any(
            why in said["message"] for why in ("Insufficient nvidia.com/gpu", "didn't match Pod's node")
        ), (example, said)
        assert examples[example]["phase"] != "Failed", (example, examples[example])
    for example in KUEUE_QUEUED:  # held by its Volcano gang (and Kueue's admission), neither given here
        waiting = cond.condition(examples[example]["conditions"], cond.QUEUED)
        assert waiting is not None, examples[example]
        assert waiting["reason"] in ("WaitingForGang", "WaitingForAdmission"), waiting

    # The gang's policy: it waits Queued for as long as the scheduler holds it (the coscheduling plugin
    # retries after scheduleTimeoutSeconds); the operator never fails a job for waiting.
    assert gang.get("phase") == "Queued", gang
    waiting = cond.condition(gang["conditions"], cond.QUEUED)
    assert waiting is not None and waiting["reason"] == "WaitingForGang", gang
    assert "of the gang placed by the coscheduling scheduler" in waiting["message"], waiting
    assert "0/2 of the gang placed" in waiting["message"], waiting
    placed = cond.condition(gang["conditions"], cond.UNSCHEDULABLE)
    assert placed is not None and "Insufficient nvidia.com/gpu" in placed["message"], gang
    # All or nothing, as the plugin places a gang: the learner would fit, but not with its rollout, so
    # neither is bound; the learner waited at the plugin's Permit stage and was rejected at the timeout.
    assert set(gang_pods) == {"gang-learner-0", "gang-rollout-0"}, gang_pods
    assert not [name for name, pod in gang_pods.items() if pod["spec"].get("nodeName")], gang_pods
    scheduled = {
        name: cond.condition(pod["status"].get("conditions") or [], "PodScheduled")
        for name, pod in gang_pods.items()
    }
    assert "Insufficient nvidia.com/gpu" in scheduled["gang-rollout-0"]["message"], scheduled
    assert scheduled["gang-learner-0"]["message"] == (
        "rejected due to timeout after waiting 1s at plugin Coscheduling"
    ), scheduled

    if oom_refused is not None:
        pytest.skip(f"the OOM half needs a memory cgroup: {oom_refused}")
    assert small is not None
    failure = cond.condition(small["conditions"], cond.FAILED)
    assert failure is not None and failure["reason"] == "OOMKilled", small
    message = failure["message"]
    assert "pod small-learner-0 (learner)" in message, message
    assert f"was OOMKilled under its memory limit {LIMIT}" in message, message
    assert "roles.learner.resources.memory" in message, message  # the planner's fix names the field
    # The figure is the worker's own, planned from the model's config.json on the claim; the operator's
    # fallback ("has no estimate") is what it would say without it.
    assert (
        "; the planner estimates ~" in message and " GiB of host memory per learner worker; set " in message
    )
    assert "has no estimate" not in message and "dverlMemory" not in message, message
    assert not [m for _, m in events if "dverlMemory" in m], events
    assert any(r == "OOMKilled" and "small-learner-0" in m for r, m in events), events
    assert not [m for r, m in events if r == "Restarting" and "small-" in m], events
