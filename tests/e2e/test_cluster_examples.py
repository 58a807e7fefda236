"""A shipped example applied to the emulated cluster: the real operator makes the pods, the test node
runs them, they train, and the RLHFJob reports it. (A few small steps, without the eval set, so it stays
short; examples/tiny-grpo-cluster.yaml: the model is built from its config, the data comes from a PVC
through spec.sources, the checkpoints and metrics go to another PVC.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]


async def test_tiny_grpo_in_cluster_form_trains_to_succeeded(tmp_path: Path) -> None:
    folders = claims(tmp_path)
    async with cluster(tmp_path, folders) as (emu, node, op):
        await emu.create_job("tiny", cluster_spec(steps=3))

        async def finished():
            job = await emu.job("tiny")
            phase = ((job or {}).get("status") or {}).get("phase")
            return job if phase in ("Succeeded", "Failed") else None

        try:
            job = await wait_for(finished, timeout=240, interval=0.5, what="the job to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None
        status = job["status"]
        assert status["phase"] == "Succeeded", (status, node.all_logs()[-6000:])
        assert status["step"] == 3 and status["policyVersion"] == 3
        assert 0.0 <= status["reward"] <= 1.0  # the toy task's reward is a 0/1 score, averaged
        assert {role: c["desired"] for role, c in status["roles"].items()} == {"learner": 1, "rollout": 1}
        assert status["workers"].endswith("/2")
        assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in status["conditions"])
        # The job is Succeeded once the learner reports its last step; the learner pod stays and its
        # process then flushes and exits on its own, with 0.
        runner = node.running("tiny-learner-0").runner

        async def learner_exited():
            main = runner.state.main[0]
            return main if main.state == "terminated" else None

        learner = await wait_for(learner_exited, timeout=60, interval=0.5, what="the learner to exit")
        assert learner.exit_code == 0, node.all_logs()[-3000:]
    # The learner wrote its run to the checkpoint claim: one metrics row per step.
    assert [row["step"] for row in read_metrics(folders["rl-checkpoints"] / "metrics.jsonl")] == [1, 2, 3]
