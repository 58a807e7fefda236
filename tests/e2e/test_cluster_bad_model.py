"""A job whose model path does not exist, run on the test node: its workers exit with the runtime's
bad-input code naming the field, and the operator fails the job at once (no restart can mend it, so
none is made, whatever backoffLimit allows) with a condition and an event that name the field and the
pod, and leaves no pod crash-looping. Beside it, in the same cluster, a job whose checkpoint claim is full
(a real 64 KiB volume): its learner trains a step, cannot write the checkpoint, and the job fails the same
way at once (BadInput, from its exit code or its coordinator's Status reply, whichever comes first), its
condition naming the folder, the room it needed and what to change."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for
from tests.support.small_volume import refused as small_volume_refused
from tests.support.small_volume import small_volume

REASON = refused() or small_volume_refused()
pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
FIELD = "spec.model.path"


async def test_a_missing_model_path_fails_the_job_naming_the_field_and_the_pod(tmp_path: Path) -> None:
    spec = cluster_spec(steps=2)
    spec["model"] = {"path": "/data/models/missing", "dtype": "float32"}
    spec["backoffLimit"] = 6
    full = cluster_spec(steps=2)
    full["backoffLimit"] = 6
    volumes = claims(tmp_path)
    with small_volume(volumes["rl-checkpoints"], "64k"):
        async with cluster(tmp_path, volumes) as (emu, node, op):
            await emu.create_job("bad", spec)
            await emu.create_job("full", full)
            try:
                job = await wait_for(
                    lambda: _failed(emu, "bad"), timeout=300, interval=0.5, what="the job to fail"
                )
                no_room = await wait_for(
                    lambda: _failed(emu, "full"), timeout=300, interval=0.5, what="full fails"
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None
            await wait_for(lambda: _no_pods(emu), timeout=60, what="the failed job's pods to go")
            await asyncio.sleep(2.0)  # a few more passes: nothing comes back
            assert await emu.pods("bad") == {}
            every = await emu.events()  # each names the RLHFJob it is about: the bad job's
            events = [(e["reason"], e["message"]) for e in every if e["involvedObject"]["name"] == "bad"]
            incarnations = [p for p in node.pods.values() if p.key[1].startswith("bad-")]
            learners = [p for p in node.pods.values() if p.key[1].startswith("full-learner-")]
    said = next(c for c in no_room["status"]["conditions"] if c["type"] == "Failed")
    # Whichever the operator hears first, the learner's exit 2 or its coordinator's Status reply, the
    # condition is BadInput with the learner's words.
    assert said["reason"] == "BadInput", said
    assert "pod full-learner-0 (learner)" in said["message"] or "coordinator reports" in said["message"], said
    assert "checkpoint '/checkpoints/checkpoint-1' was not written: it needs about" in said["message"], said
    assert "spec.training.checkpoint.keep" in said["message"], said
    assert len(learners) == 1, [p.key for p in learners]  # failed at once: no restart into the same wall
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


async def _failed(emu: Any, name: str) -> Any:
    job = await emu.job(name)
    return job if ((job or {}).get("status") or {}).get("phase") == "Failed" else None


async def _no_pods(emu: Any) -> bool:
    return await emu.pods("bad") == {}
