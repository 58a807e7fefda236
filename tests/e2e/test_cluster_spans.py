"""A job whose rollout is served as 3 layer spans in 3 span pods, run by the real operator on the test
node: it trains to Succeeded, and a span pod's process SIGKILLed mid-training is brought back (by the
pod's restart or the operator's replacement) while the front replays its sessions into it; every step is
learned exactly once. (The tiny model of the cluster example, with 3 layers.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
STEPS = 12


def spans_spec() -> dict[str, Any]:
    spec = cluster_spec(steps=STEPS)
    spec["model"] = {**spec["model"], "tiny": {**spec["model"]["tiny"], "numLayers": 3}}
    spec["data"] = {**spec["data"], "maxNewTokens": 16}
    spec["roles"]["rollout"] = {**spec["roles"]["rollout"], "spans": {"count": 3}}
    return spec


async def test_a_job_served_as_three_span_pods_trains_and_survives_a_span_kill(tmp_path: Path) -> None:
    folders = claims(tmp_path)
    async with cluster(tmp_path, folders) as (emu, node, op):
        await emu.create_job("spans", spans_spec())

        async def status_at(step: int) -> Any:
            job = await emu.job("spans")
            status = (job or {}).get("status") or {}
            assert status.get("phase") != "Failed", (status, node.all_logs()[-6000:])
            return status if int(status.get("step") or 0) >= step else None

        async def learner_at(step: int) -> Any:
            await status_at(0)  # a Failed job ends the wait at once
            return f"step {step}/{STEPS}" in node.logs("spans-learner-0") or None

        async def finished() -> Any:
            job = await emu.job("spans")
            phase = ((job or {}).get("status") or {}).get("phase")
            return job if phase in ("Succeeded", "Failed") else None

        def explain(what: str) -> str:
            return f"{what}\n{node.all_logs()[-8000:]}\n{op.log()[-3000:]}"

        try:
            # The learner's own log says step 2 at once; the job's status trails it by a report, and a
            # short job can end within that lag, before the kill it is meant to survive.
            await wait_for(lambda: learner_at(2), timeout=300, interval=0.1, what="step 2")
            victim = node.running("spans-span-1")
            assert victim is not None, explain("no pod spans-span-1")
            process = next(iter(victim.runner.processes.values()))
            os.killpg(process.pid, signal.SIGKILL)  # the span server dies mid-training, no goodbye
            job = await wait_for(finished, timeout=400, interval=0.5, what="the job to finish")
        except AssertionError as exc:
            raise AssertionError(explain(str(exc))) from None
        status = job["status"]
        assert status["phase"] == "Succeeded", explain(str(status))
        for index, layers in enumerate(["0:1", "1:2", "2:3"]):
            assert f"layers {layers} of rollout 0 ready" in node.logs(f"spans-span-{index}")
        again = node.logs("spans-span-1").count("layers 1:2 of rollout 0 ready")
        assert again >= 2, explain("the killed span server was not started again")
        front = node.logs("spans-rollout-0")
        assert "trying" in front or "missed the refresh" in front, explain("the front never saw the span go")
    records = read_metrics(folders["rl-checkpoints"] / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:  # every prompt x sample answered exactly once, also in the step of the kill
        assert r["samples"] == r["expected_samples"] == r["unique_samples"]
        assert r["duplicates_dropped"] == 0
