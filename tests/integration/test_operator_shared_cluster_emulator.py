"""The real operator on a shared cluster (kmock's API emulator serving the PodGroup APIs): the gang
PodGroup made, scaled and removed; Kueue-gated pods reported as Queued; a preempted learner restarting
its gang without spending backoffLimit. Tests play the kubelet, the gang scheduler and Kueue's webhook."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.support.operator_fixtures import Emulator, Operator, tiny_spec, wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

COSCHEDULING = "apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"
KUEUE_GATE = {"name": "kueue.x-k8s.io/admission"}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared-cluster")
    # The chart installed with both gang schedulers on: its RBAC grants their PodGroups.
    gangs = ["gangScheduling.coscheduling=true", "gangScheduling.volcano=true"]
    async with Emulator(tmp, chart_values=gangs) as emu:
        emu.register_pod_groups()
        op = Operator(emu, "op-a", env={"DVERL_GANG_SCHEDULERS": "coscheduling,volcano"}).start()
        try:
            yield emu
        finally:
            code = await asyncio.to_thread(op.stop)
    assert code == 0, op.log()[-3000:]


async def status_of(emu: Emulator, job: str, check, what: str, timeout: float = 30):
    async def probe():
        status = ((await emu.job(job)) or {}).get("status") or {}
        return status if check(status) else None

    return await wait_for(probe, timeout=timeout, what=what)


async def pod_group(emu: Emulator, name: str):
    return await emu.call("GET", f"{COSCHEDULING}/{name}")


async def set_pod(emu: Emulator, name: str, spec: dict | None = None, status: dict | None = None) -> None:
    path = f"api/v1/namespaces/default/pods/{name}"
    if spec is not None:
        await emu.call("PATCH", path, {"spec": spec}, "application/merge-patch+json")
    if status is not None:
        await emu.call("PATCH", f"{path}/status", {"status": status}, "application/merge-patch+json")


async def test_the_gang_podgroup_follows_the_plan_scale_and_suspend(cluster):
    emu = cluster
    spec = tiny_spec()
    spec["scheduling"] = {"gang": {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 30}}
    await emu.create_job("gang", spec)
    group = await wait_for(lambda: pod_group(emu, "gang"), what="the gang's PodGroup")
    pods = await wait_for(lambda: _count(emu, "gang", 3), what="3 pods")
    assert group["spec"]["minMember"] == len(pods) == 3
    assert group["metadata"]["ownerReferences"][0]["name"] == "gang"
    assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods.values()} == {"gang"}
    status = await status_of(emu, "gang", lambda s: s.get("phase") == "Queued", "Queued (gang unplaced)")
    assert "0/3 of the gang placed" in status["message"]

    await emu.run_all_pods("gang")
    await status_of(emu, "gang", lambda s: s.get("phase") == "Running", "Running")

    await emu.patch_job_spec("gang", {"roles": {"rollout": {"replicas": 4}}})
    await wait_for(lambda: _min_member(emu, "gang", 5), what="minMember following the scale-up", timeout=30)
    await emu.patch_job_spec("gang", {"suspend": True})
    await wait_for(lambda: _gone(emu, "gang"), what="the PodGroup removed on suspend")
    await status_of(emu, "gang", lambda s: s.get("phase") == "Suspended", "Suspended")
    await emu.patch_job_spec("gang", {"suspend": False})
    await wait_for(lambda: _min_member(emu, "gang", 5), what="the PodGroup back on resume")


async def test_kueue_gated_pods_are_queued_until_admitted(cluster):
    emu = cluster
    await emu.create_job("queued", tiny_spec(), labels={"kueue.x-k8s.io/queue-name": "team-a"})
    pods = await wait_for(lambda: _count(emu, "queued", 3), what="3 pods")
    groups = {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods.values()}
    assert len(groups) == 1
    assert {p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods.values()} == {
        "3"
    }
    for name in pods:  # Kueue's webhook holds every pod until its workload is admitted
        await set_pod(emu, name, spec={"schedulingGates": [KUEUE_GATE]})
    status = await status_of(emu, "queued", lambda s: s.get("phase") == "Queued", "Queued (Kueue gate)")
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert queued["reason"] == "WaitingForAdmission"
    assert status["kueuePodGroup"]["name"] == groups.pop()
    for name in pods:  # admitted: the gates are lifted and the pods start
        await set_pod(emu, name, spec={"schedulingGates": None})
    await emu.run_all_pods("queued")
    await status_of(emu, "queued", lambda s: s.get("phase") == "Running", "Running once admitted")


async def test_a_preempted_learner_restarts_the_gang_without_spending_backoff_limit(cluster):
    emu = cluster
    spec = {**tiny_spec(), "backoffLimit": 0, "priorityClassName": "rl-low"}
    spec["scheduling"] = {"gang": {"scheduler": "volcano", "queue": "research"}}
    await emu.create_job("preempt", spec)
    pods = await wait_for(lambda: _count(emu, "preempt", 3), what="3 pods")
    assert {p["spec"]["priorityClassName"] for p in pods.values()} == {"rl-low"}
    assert {p["spec"]["schedulerName"] for p in pods.values()} == {"volcano"}
    await emu.run_all_pods("preempt")
    await status_of(emu, "preempt", lambda s: s.get("phase") == "Running", "Running")
    disrupted = {
        "phase": "Failed",
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "x"}
        ],
    }
    await set_pod(emu, "preempt-learner-0", status=disrupted)

    async def replaced():
        pod = (await emu.pods("preempt")).get("preempt-learner-0")
        fresh = pod is not None and (pod.get("status") or {}).get("phase") != "Failed"
        return fresh and None in emu.history("pods", "preempt-learner-0")  # deleted, then made anew

    await wait_for(replaced, what="the learner replaced", timeout=30)
    events = await wait_for(
        lambda: _events(emu, "preempt", "Preempted"), what="a Preempted event on the job", timeout=30
    )
    assert "without counting against backoffLimit" in events[0]["message"]
    await emu.run_all_pods("preempt")
    status = await status_of(emu, "preempt", lambda s: s.get("phase") == "Running", "Running again")
    assert status["roles"]["learner"]["restarts"] == 0


async def _count(emu: Emulator, job: str, count: int):
    pods = await emu.pods(job)
    alive = {n: p for n, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
    return alive if len(alive) == count else None


async def _min_member(emu: Emulator, name: str, count: int):
    group = await pod_group(emu, name)
    return group is not None and group["spec"]["minMember"] == count


async def _gone(emu: Emulator, name: str):
    return await pod_group(emu, name) is None


async def _events(emu: Emulator, job: str, reason: str):
    found = [
        e for e in await emu.events() if e["involvedObject"]["name"] == job and e.get("reason") == reason
    ]
    return found or None
