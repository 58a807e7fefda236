"""End to end: a GRPO job whose rollout runs as 3 layer-span processes, started by `dverl run`'s local
cluster on its secured path (TLS, the job token, signed weights), trains; and a span process killed with
SIGKILL mid-step, then restarted by the launcher as its failure policy says, loses and duplicates no
sample: the front replays each open session into the restarted span and brings it to the chain's
weights first."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from decentralized_verl.launch.run import coordinator_status, run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.processes import wait_for_line
from tests.support.secured_cluster import secured_cluster

SPANS = {
    "roles.rollout": {"replicas": 1, "batchSize": 16, "spans": {"count": 3}},
    "model.tiny.numLayers": 3,
    "training.evalEvery": 0,
}


def test_dverl_run_trains_with_the_rollout_served_as_three_spans(tmp_path: Path) -> None:
    job = e2e_manifest(tmp_path, "spans-e2e", **{**SPANS, "training.steps": 3})
    summary = run_job(job, tmp_path / "run", progress=False, timeout=600)
    assert summary["steps"] == 3 and summary["policy_version"] == 3
    logs = tmp_path / "run" / "logs"
    for index, layers in enumerate(["0:1", "1:2", "2:3"]):
        assert f"layers {layers} of rollout 0 ready" in (logs / f"spans-e2e-span-{index}.log").read_text()
    for r in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert r["samples"] == r["expected_samples"] == r["unique_samples"] == 128


def test_a_span_killed_mid_step_is_restarted_and_no_sample_is_lost(tmp_path: Path) -> None:
    path = e2e_manifest(tmp_path, "spankill-e2e", **{**SPANS, "training.steps": 5, "data.maxNewTokens": 32})
    output = tmp_path / "run"
    cluster, creds = secured_cluster(path, output)
    learner = cluster.by_role("learner")[0]
    victim = cluster.by_role("span")[1]
    front = cluster.by_role("rollout")[0]
    killed_at = None
    with cluster:
        cluster.start()
        deadline = time.monotonic() + 600
        while learner.alive() and time.monotonic() < deadline:
            status = coordinator_status(learner.address, creds)
            if killed_at is None and status and status.phase == "rollout" and status.step >= 2:
                cluster.kill(victim.worker.name, signal.SIGKILL)
                victim.process.wait()
                killed_at = status.step
                # No step's rollout can finish without the span: the front meets the gap before the
                # span is back, however fast the job ran up to the kill.
                wait_for_line(front.log_path, r"trying|missed the refresh", timeout=300, alive=learner.alive)
                cluster.restart(victim.worker.name)  # restartPod, as `dverl run` and the operator do
            time.sleep(0.02)
        assert learner.process.wait(timeout=60) == 0, learner.log_tail()
    assert killed_at is not None and victim.restarts == 1
    front_log = front.log_path.read_text()
    assert "trying" in front_log or "missed the refresh" in front_log  # the front saw the span go
    records = read_metrics(output / "metrics.jsonl")
    assert len(records) == 5
    for r in records:  # every prompt x sample answered exactly once, also in the step of the kill
        assert r["samples"] == r["expected_samples"] == r["unique_samples"] == 128
        assert r["duplicates_dropped"] == 0
