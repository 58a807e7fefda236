"""The shipped examples that fit a CPU, applied as shipped (their relative data paths included) to the
emulated cluster and run on the test node, one harness for all: each is cut to two small steps and
must reach Succeeded, its data found in the worker image's examples folder (which the node binds as the
image's layers would). The GPU- and vLLM-sized examples are checked without a cluster: their paths and
images by tests/unit/test_examples_in_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster_node import claims, cluster
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for
from tests.support.paths import ROOT

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
)
"""Every shipped example with a config-built model, no source or image beyond the default, one learner."""
STEPS = 2


def shipped(name: str) -> dict[str, Any]:
    """The example's spec as shipped, cut short: two steps of a few samples, no evaluation."""
    spec = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())["spec"]
    spec["algorithm"] = {**spec["algorithm"], "samplesPerPrompt": 2}
    for role in spec["roles"].values():
        if "batchSize" in role:
            role["batchSize"] = 2
    spec["training"] = {
        **spec["training"],
        "steps": STEPS,
        "batchSize": 2,
        "minibatchSize": 2,
        "evalEvery": 0,
    }
    spec["training"].pop("checkpoint", None)
    return spec


async def test_every_cpu_sized_example_succeeds_as_shipped(tmp_path: Path) -> None:
    """All at once on the one node (each is tiny; together they finish sooner than one after another)."""
    async with cluster(tmp_path, claims(tmp_path)) as (emu, node, op):
        for name in CPU_SIZED:
            spec = shipped(name)
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
        for name, job in jobs.items():
            status = job["status"]
            assert status["phase"] == "Succeeded", (
                f"{name}: {status.get('message')}\n{node.all_logs()[-4000:]}"
            )
            assert status["step"] == STEPS, (name, status)
