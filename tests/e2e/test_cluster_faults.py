"""Faults a cluster deals out, survived by the job the operator runs on the test node: a rollout pod
deleted (`kubectl delete pod`) and the learner pod evicted (SIGTERM, then the pod fails with reason
Evicted). The learner resumes from its checkpoint on the claim and every step is learned exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for
from tests.support.processes import learner_step

REASON = refused()
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
STEPS = 60  # steps take well under a second: enough that both faults land mid-training


def faulted_spec() -> dict[str, Any]:
    spec = cluster_spec(steps=STEPS)
    spec["algorithm"] = {**spec["algorithm"], "klCoef": 0.01}
    spec["roles"] = {
        **spec["roles"],
        "reward": {"replicas": 1},
        "reference": {"replicas": 1},
    }
    return spec


async def test_training_survives_a_deleted_rollout_pod_and_an_evicted_learner(tmp_path: Path) -> None:
    folders = claims(tmp_path)
    ckpt = folders["rl-checkpoints"]
    async with cluster(tmp_path, folders) as (emu, node, op):
        await emu.create_job("faulty", faulted_spec())

        def learner_log() -> str:
            return node.logs("faulty-learner-0")

        async def stepped(n: int) -> int:
            """The learner's own progress line at step `n` or later (the job's status lags behind it)."""
            job = await emu.job("faulty")
            status = (job or {}).get("status") or {}
            assert status.get("phase") != "Failed", (status, node.all_logs()[-6000:])
            reached = learner_step(learner_log())
            return reached if reached >= n else 0

        def explain(what: str) -> str:
            return f"{what}\n{node.all_logs()[-8000:]}\n{op.log()[-3000:]}"

        try:
            await wait_for(lambda: stepped(2), timeout=300, interval=0.05, what="step 2")
            # Each fault is dealt while the learner is held at a step it has just logged, so it lands
            # mid-run however fast the job trains. Once the rollout pod (the only one) is gone, the learner
            # cannot step on until the new one serves.
            first_rollout = node.running("faulty-rollout-0")
            with node.paused("faulty-learner-0"):
                await emu.delete_pod("faulty-rollout-0")
                await wait_for(lambda: _signalled(first_rollout), timeout=60, what="the deletion's SIGTERM")
            await wait_for(
                lambda: _replaced(node, "faulty-rollout-0", first_rollout.uid),
                timeout=240,
                what="a new rollout pod",
            )
            reached = learner_step(learner_log())
            await wait_for(lambda: stepped(reached + 1), timeout=240, interval=0.05, what="a step after")
            with node.paused("faulty-learner-0") as evicted:
                eviction = asyncio.create_task(node.evict("faulty-learner-0"))
                await wait_for(lambda: _signalled(evicted), timeout=60, what="the eviction's SIGTERM")
            await eviction
            done = await wait_for(lambda: _finished(emu), timeout=400, interval=0.5, what="the job to finish")
        except AssertionError as exc:
            raise AssertionError(explain(str(exc))) from None
        status = done["status"]
        assert status["phase"] == "Succeeded", explain(str(status))
        # The cluster took the pods away: nothing counts against backoffLimit.
        assert all(role["restarts"] == 0 for role in status["roles"].values()), explain(str(status["roles"]))
        learner_end = evicted.runner.state.main[0]
        events = [e["reason"] for e in await emu.events()]
    assert first_rollout.runner.state.main[0].exit_code == 0, "a rollout worker finishes its calls on SIGTERM"
    assert learner_end.exit_code == 143, "the learner checkpoints and exits 143 on SIGTERM"
    assert "Evicted" in events
    steps = [row["step"] for row in read_metrics(ckpt / "metrics.jsonl")]
    assert steps == list(range(1, STEPS + 1)), steps


async def _signalled(pod: Any) -> bool:
    return pod.runner.stopping


async def _replaced(node: Any, name: str, old_uid: str) -> bool:
    new = node.running(name)
    return new is not None and new.uid != old_uid and new.runner.state.main[0].state == "running"


async def _finished(emu: Any) -> Any:
    job = await emu.job("faulty")
    phase = ((job or {}).get("status") or {}).get("phase")
    return job if phase in ("Succeeded", "Failed") else None
