"""A job whose model path does not exist, run on the test node: its workers exit with the runtime's
bad-input code naming the field, and the operator fails the job at once (no restart can mend it, so
none is made, whatever backoffLimit allows) with a condition and an event that name the field and the
pod, and leaves no pod crash-looping."""

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
    spec["backoffLimit"] = 6
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
    assert condition["status"] == "True" and condition["reason"] == "BadInput"
    assert FIELD in condition["message"] and "pod bad-" in condition["message"], condition
    assert "not retried" in condition["message"], condition
    bad_input = [m for r, m in events if r == "BadInput"]
    assert len(bad_input) == 1 and FIELD in bad_input[0] and "pod bad-" in bad_input[0], events
    worker_failed = [m for r, m in events if r == "WorkerFailed"]
    assert worker_failed and all(FIELD in m for m in worker_failed), worker_failed
    assert not [r for r, _ in events if r in ("Restarting", "BackoffLimitExceeded")], events
    # No pod was made twice: the first bad-input exit ended the job.
    names = [p.key[1] for p in incarnations]
    assert len(names) == len(set(names)), names
    # The workers exited with the CLI's bad-input code, not a crash.
    codes = {p.runner.state.main[0].exit_code for p in incarnations}
    assert 2 in codes, codes


async def _no_pods(emu: Any) -> bool:
    return await emu.pods("bad") == {}
