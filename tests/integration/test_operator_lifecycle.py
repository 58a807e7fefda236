"""The operator process itself: killed mid-reconcile and restarted, and two replicas behind one Lease."""

from __future__ import annotations

import asyncio
import datetime
import urllib.request

import pytest

from dverl_operator.process.leader import LEASE_NAME, micro_time
from tests.support.operator_fixtures import Emulator, Operator, pods_if, tiny_spec, wait_for

pytestmark = [pytest.mark.timeout(180)]
LEASES = "apis/coordination.k8s.io/v1/namespaces/default/leases"


async def pod_count(emu: Emulator, job: str) -> int:
    return len(await emu.pods(job))


async def test_killed_mid_reconcile_converges_without_duplicates(tmp_path):
    spec = tiny_spec(roles={"rollout": {"replicas": 60}, "learner": {"replicas": 1}})
    async with Emulator(tmp_path) as emu:
        first = Operator(emu, "op-a").start()
        try:
            await emu.create_job("big", spec)
            await wait_for(lambda: pod_count(emu, "big"), timeout=60, interval=0.01, what="first pod")
            first.kill()  # SIGKILL while the pass is creating pods
            partial = await pod_count(emu, "big")
        finally:
            first.kill()
        # Restarted (same pod name, so same Lease identity): finishes the job's children.
        second = Operator(emu, "op-a").start()
        try:
            pods = await wait_for(
                lambda: pods_if(emu, "big", 61), timeout=60, what=f"61 pods after restart (had {partial})"
            )
            await asyncio.sleep(1.0)  # a few more passes: still no churn
            assert len(await emu.pods("big")) == 61
            for name in pods:
                history = emu.history("pods", name)
                assert None not in history, f"{name} was deleted and recreated: {history}"
            assert None not in emu.history("configmaps", "big-config")
            job = await emu.job("big")
            assert job["status"]["workers"] == "0/61"
        finally:
            code = await asyncio.to_thread(second.stop)
        assert code == 0, second.log()[-2000:]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


async def _scrape_when_up(port: int) -> str | None:
    try:
        return await asyncio.to_thread(scrape, port)
    except OSError:  # not listening yet (URLError is an OSError)
        return None


async def holder(emu: Emulator) -> str | None:
    lease = await emu.call("GET", f"{LEASES}/{LEASE_NAME}")
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


async def test_only_the_lease_holder_acts(tmp_path):
    async with Emulator(tmp_path) as emu:
        # Someone else holds the Lease and keeps renewing it.
        renewing = True

        async def other_holder() -> None:
            while renewing:
                now = micro_time(datetime.datetime.now(tz=datetime.UTC))
                body = {
                    "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3, "renewTime": now}
                }
                if await emu.call("GET", f"{LEASES}/{LEASE_NAME}") is None:
                    await emu.call(
                        "POST", LEASES, {"metadata": {"name": LEASE_NAME, "namespace": "default"}, **body}
                    )
                else:
                    await emu.call("PATCH", f"{LEASES}/{LEASE_NAME}", body, "application/merge-patch+json")
                await asyncio.sleep(0.3)

        other = asyncio.create_task(other_holder())
        await asyncio.sleep(0.2)
        a = Operator(emu, "op-a").start()
        b: Operator | None = None
        try:
            await emu.create_job("first", tiny_spec())
            # Alive and observable while following (a loaded machine may take seconds to start it) ...
            metrics = await wait_for(
                lambda: _scrape_when_up(a.metrics_port), timeout=60, what=f"op-a's metrics\n{a.log()}"
            )
            assert "dverl_operator_leader 0.0" in metrics
            # ... and, running, it leaves the job alone for longer than a resync interval.
            await asyncio.sleep(4.0)
            assert await emu.pods("first") == {}, "a follower created pods"
            assert await emu.get("configmaps", "first-config") is None

            renewing = False  # the other holder dies; op-a takes over after the lease duration
            await other
            await wait_for(lambda: pod_count(emu, "first"), timeout=30, what="op-a acts after takeover")
            assert await holder(emu) == "op-a"

            b = Operator(emu, "op-b").start()
            await asyncio.sleep(2.0)
            await emu.create_job("second", tiny_spec())
            await wait_for(lambda: pod_count(emu, "second"), timeout=30, what="pods of the second job")
            assert await holder(emu) == "op-a"
            assert "reconciled" not in b.log(), "the follower reconciled"

            a.kill()  # the leader crashes without releasing the Lease
            await wait_for(lambda: _holder_is(emu, "op-b"), timeout=30, what="op-b takes the Lease")
            await emu.create_job("third", tiny_spec())
            await wait_for(lambda: pod_count(emu, "third"), timeout=30, what="op-b acts after failover")
            # the log line follows the pods it reports: give it the moment it takes to be written
            await wait_for(lambda: _logged(b, "reconciled"), timeout=10, what="op-b logs its reconcile")
        finally:
            renewing = False
            a.kill()
            if b is not None:
                code = await asyncio.to_thread(b.stop)
                assert code == 0, b.log()[-2000:]
        # A clean stop releases the Lease for the next replica.
        assert await holder(emu) is None


async def _holder_is(emu: Emulator, identity: str) -> bool:
    return await holder(emu) == identity


def test_scale_benchmark_smoke():
    """benchmarks/operator_scale.py --smoke: 3 jobs reconciled, a table printed."""
    import subprocess
    import sys

    from tests.support.operator_fixtures import REPO

    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "operator_scale.py"), "--smoke", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    header, _, row = result.stdout.strip().splitlines()
    assert header.split()[:2] == ["jobs", "pods"]
    assert row.split()[:2] == ["3", "9"]


async def _logged(op: Operator, text: str) -> bool:
    return text in op.log()
