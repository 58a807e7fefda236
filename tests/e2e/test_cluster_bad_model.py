"""A job whose model path does not exist, run on the test node: its workers exit naming the field, the
operator restarts them after their backoff, then fails the job with a condition and an event that name
the field and the pod, and leaves no pod crash-looping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
FIELD = "spec.model.path"


async def test_a_missing_model_path_fails_the_job_naming_the_field_and_the_pod(tmp_path: Path) -> None:
    spec = cluster_spec(steps=2)
    spec["model"] = {"path": "/data/models/missing", "dtype": "float32"}
    spec["backoffLimit"] = 1
    async with cluster(tmp_path, claims(tmp_path)) as (emu, node, op):
        await emu.create_job("bad", spec)

        async def failed() -> Any:
            job = await emu.job("bad")
            return job if ((job or {}).get("status") or {}).get("phase") == "Failed" else None

        try:
            job = await wait_for(failed, timeout=300, interval=0.5, what="the job to fail")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None
        await wait_for(lambda: _no_pods(emu), timeout=60, what="the failed job's pods to go")
        await asyncio.sleep(2.0)  # a few more passes: nothing comes back
        assert await emu.pods("bad") == {}
        events = [(e["reason"], e["message"]) for e in await emu.events()]
        incarnations = [p for p in node.pods.values() if p.key[1].startswith("bad-")]
    condition = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert condition["status"] == "True" and condition["reason"] == "BackoffLimitExceeded"
    assert FIELD in condition["message"] and "pod bad-" in condition["message"], condition
    exhausted = [m for r, m in events if r == "BackoffLimitExceeded"]
    assert len(exhausted) == 1 and FIELD in exhausted[0] and "pod bad-" in exhausted[0], events
    worker_failed = [m for r, m in events if r == "WorkerFailed"]
    assert len(worker_failed) == 2, worker_failed  # backoffLimit 1: one restart, then the job fails
    assert all(FIELD in m for m in worker_failed), worker_failed
    # The workers exited with the CLI's bad-input code, not a crash.
    codes = {p.runner.state.main[0].exit_code for p in incarnations}
    assert 2 in codes, codes


async def _no_pods(emu: Any) -> bool:
    return await emu.pods("bad") == {}
