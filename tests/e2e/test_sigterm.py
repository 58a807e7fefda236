"""SIGTERM, as a pod gets it on eviction, preemption or `kubectl delete pod`, sent to real worker processes:
the learner checkpoints the last step it finished (handing back prompts drawn for a batch it did not learn
from) and exits 143, and a resumed run continues from that step; a rollout worker finishes the call in
flight, takes no new one, and exits 0."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from decentralized_verl.core.interfaces import WorkerFailure
from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.entrypoints.learner import STOPPED_EXIT
from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import coordinator_status, run_job, write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.transport.clients import GrpcRolloutClient, wait_ready
from tests.support.job_manifests import e2e_manifest
from tests.support.secured_cluster import secured_cluster

PER_STEP, PROMPTS = 16, 55
"""The toy task: 55 prompts, 16 a step, the last partial batch dropped: 3 steps an epoch."""


def test_learner_checkpoints_on_sigterm_and_the_run_resumes_there(tmp_path: Path) -> None:
    overrides = {
        "training.evalEvery": 0,
        # Only the stop writes a checkpoint: the clock's next one is far away.
        "training.checkpoint": {"every": 1000, "dir": "ckpt"},
        "roles.rollout": {"replicas": 1, "batchSize": 16},
    }
    manifest = e2e_manifest(tmp_path, "sigterm", **{"training.steps": 200, **overrides})
    output = tmp_path / "run"
    cluster, creds = secured_cluster(manifest, output)
    learner = cluster.by_role("learner")[0]
    with cluster:
        cluster.start()
        deadline = time.monotonic() + 600
        seen = 0
        while learner.alive() and time.monotonic() < deadline and seen < 2:
            status = coordinator_status(learner.address, creds)
            seen = status.step if status is not None else 0
            time.sleep(0.05)
        assert seen >= 2, learner.log_tail()
        cluster.kill(learner.worker.name, signal.SIGTERM)
        assert learner.process.wait(timeout=300) == STOPPED_EXIT, learner.log_tail()
    steps = [r["step"] for r in read_metrics(output / "metrics.jsonl")]
    last = steps[-1]
    assert steps == list(range(1, last + 1)) and last >= seen
    [folder] = sorted((output / "ckpt").iterdir())
    assert folder.name == f"checkpoint-{last}"
    state = json.loads((folder / "trainer_state.json").read_text())
    # Prompts drawn for a batch the learner never learned from are handed back: the sampler stands
    # exactly after the last learned step.
    assert state["step"] == last
    assert state["sampler"] == {"epoch": last // 3, "offset": (last % 3) * PER_STEP}
    assert "stopping after step" in learner.log_tail(200)

    again = e2e_manifest(tmp_path, "sigterm", **{"training.steps": last + 2, **overrides})
    summary = run_job(again, output, resume=True, progress=False, timeout=600)
    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, last + 3))
    assert summary["steps"] == last + 2
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] for r in records)


async def _generate(
    client: GrpcRolloutClient,
    items,
    sampling,
    arrived: list[float],
    on_first: Callable[[], None] | None = None,
) -> int:
    """How many items were answered; a prefix of an unfinished one (sent when decoding is slow) is not.
    `on_first` runs as the first answer arrives, before anything else is read."""
    count = 0
    async for sample in client.generate(items, sampling, 0):
        if on_first is not None and not arrived:
            on_first()
        arrived.append(time.monotonic())
        count += sample.finish_reason != "partial"
    return count


def test_rollout_worker_finishes_its_call_then_exits_0(tmp_path: Path) -> None:
    manifest = e2e_manifest(
        tmp_path, "sigterm-rollout", **{"roles.rollout": {"replicas": 1, "batchSize": 16}}
    )
    job = load_job(manifest)
    output = tmp_path / "run"
    config = write_config(job, manifest, output)
    cluster = LocalCluster(plan_job(job.spec, job.metadata.name), config, output)  # plaintext: no creds
    worker = cluster.by_role("rollout")[0]
    with cluster:
        cluster.start(roles=("rollout",))
        asyncio.run(_sigterm_mid_call(cluster, worker))
        assert worker.process.wait(timeout=120) == 0, worker.log_tail()
    assert "ready on port" in worker.log_tail(200)


async def _sigterm_mid_call(cluster: LocalCluster, worker) -> None:
    client = GrpcRolloutClient(worker.address, worker.worker.name)
    try:
        await wait_ready(worker.address, timeout=300)
        prompts = [Prompt(f"p{i}", i, tuple(range(3, 10)), "1+1=", ground_truth="2") for i in range(16)]
        items = [(p, k) for p in prompts for k in range(8)]
        sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1)
        arrived: list[float] = []
        pid = worker.process.pid
        # The worker is held (SIGSTOP) the moment its first answer reaches us, and gets SIGTERM while held:
        # it is mid-call when the signal lands however fast it generates (128 items, in micro-batches).
        stop = functools.partial(os.killpg, pid, signal.SIGSTOP)
        call = asyncio.create_task(_generate(client, items, sampling, arrived, on_first=stop))
        while not arrived and not call.done():
            await asyncio.sleep(0.01)
        signalled = time.monotonic()
        cluster.kill(worker.worker.name, signal.SIGTERM)
        os.killpg(pid, signal.SIGCONT)
        assert await call == len(items)  # the call in flight was finished
        assert any(t > signalled for t in arrived), "the worker answered after SIGTERM"
        with pytest.raises(WorkerFailure):
            await _generate(client, items[:1], sampling, [])  # but no new call is taken
    finally:
        await client.close()


def test_learner_waiting_for_its_workers_leaves_at_once(tmp_path: Path) -> None:
    """A learner that has not learned a step yet (its rollout worker never came) has nothing to save: it
    leaves on SIGTERM without a checkpoint instead of waiting out the pod's grace period."""
    overrides = {"training.evalEvery": 0, "training.checkpoint": {"every": 1000, "dir": "ckpt"}}
    manifest = e2e_manifest(
        tmp_path, "sigterm-early", **{"roles.rollout": {"replicas": 1, "batchSize": 16}, **overrides}
    )
    output = tmp_path / "run"
    cluster, creds = secured_cluster(manifest, output)
    learner = cluster.by_role("learner")[0]
    with cluster:
        cluster.start(roles=("learner",))  # its rollout worker never starts
        deadline = time.monotonic() + 300
        while learner.alive() and time.monotonic() < deadline:
            status = coordinator_status(learner.address, creds)
            if status is not None:  # serving, and waiting for its rollout worker
                break
            time.sleep(0.05)
        assert learner.alive(), learner.log_tail()
        cluster.kill(learner.worker.name, signal.SIGTERM)
        assert learner.process.wait(timeout=60) == STOPPED_EXIT, learner.log_tail()
    assert not (output / "ckpt").exists() or not any((output / "ckpt").iterdir())
    assert "stopped after step 0" in learner.log_tail(200)
