"""`dverl run --ray`: the plan's workers as actors of a real local Ray cluster (one small head for the
module), the tiny GRPO job with rollout, reward and reference workers run through it end to end while
an actor of each role is killed, and `dverl status --ray` reading the job from the cluster.

Here the jobs that train end to end; the pure checks in tests/unit/; the ones with real processes and
servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from decentralized_verl.planning.plan import plan_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import load_job
from tests.support.processes import wait_for_step
from tests.support.ray_head import ROOT, dverl_on_ray, ray_client_env

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos

STEPS = 8
FAULTS = ((2, "rollout"), (3, "reward"), (4, "process"), (5, "reference"), (6, "learner"))
"""Step the learner has logged -> what is killed then: a role's actor (rollout-1, the others' only worker),
or, for "process", rollout-0's worker process alone (restarted inside its actor)."""


# ----------------------------------------------------------------------------------- a real cluster


@pytest.mark.timeout(900)
def test_tiny_job_runs_on_ray_survives_a_killed_actor_of_each_role_and_shows_in_status(
    ray_address: str, tmp_path: Path
) -> None:
    import ray

    job = chaos.tiny_job(tmp_path, "rayjob", STEPS, seed=3)
    output = tmp_path / "run"
    with (tmp_path / "run.log").open("w") as log:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "decentralized_verl.cli",
                "run",
                str(job),
                "-o",
                str(output),
                "--ray",
                ray_address,
            ],
            env=ray_client_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ray.init(address=ray_address, namespace="dverl", log_to_driver=False)
    learner_log = output / "logs" / "rayjob-learner-0.log"
    killed: dict[str, int] = {}
    status_seen = None
    logged_then = 0
    try:
        pending = list(FAULTS)
        while pending:
            step = wait_for_step(learner_log, pending[0][0], timeout=600, alive=lambda: run.poll() is None)
            # The learner's worker is held (SIGSTOP) while the faults due are dealt, so however fast the
            # job trains, each lands mid-run.
            learner = ray.get_actor("rayjob-learner-0")
            ray.get(learner.signal.remote(signal.SIGSTOP))
            try:
                if status_seen is None:
                    status_seen = dverl_on_ray("status", "rayjob", "--ray", ray_address, "--json")
                    logged_then = step
                while pending and pending[0][0] <= step:
                    _, what = pending.pop(0)
                    if what == "process":
                        actor = ray.get_actor("rayjob-rollout-0")
                        killed[what] = ray.get(actor.pid.remote())
                        ray.get(actor.signal.remote(signal.SIGKILL))
                        continue
                    name = f"rayjob-{what}-{1 if what == 'rollout' else 0}"
                    ray.kill(ray.get_actor(name))  # the actor, and with it its worker process
                    killed[what] = step
            finally:
                with contextlib.suppress(ray.exceptions.RayActorError):  # gone when it was the learner's
                    ray.get(learner.signal.remote(signal.SIGCONT), timeout=60)
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-4000:]
        leftover = [
            a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "rayjob" in a["name"]
        ]
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(60)
        ray.shutdown()
    assert set(killed) == {what for _, what in FAULTS}, killed
    assert leftover == []  # every actor of the job went with it
    # every step once, every sample of every step answered exactly once, across the kills
    rows = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] for r in rows)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["learner_restarts"] >= 1
    restarted = {"rayjob-rollout-0", "rayjob-rollout-1", "rayjob-reward-0", "rayjob-reference-0"}
    assert set(summary["worker_restarts"]) >= restarted
    log = (tmp_path / "run.log").read_text()
    assert "worker rayjob-rollout-0 exited with code -9; restarting it" in log
    assert "actor of rayjob-rollout-0 is gone" not in log  # its actor lived on and started it again
    # the learner came back from its checkpoint, not from scratch
    assert "resumed from" in (output / "logs" / "rayjob-learner-0.log").read_text()
    # status, read from the cluster while the job ran: one named actor per planned worker, each running
    assert status_seen is not None and status_seen.returncode == 0, status_seen
    status = json.loads(status_seen.stdout)
    # the supervisor's record of the step follows its polls of the learner: never ahead of what it logged
    assert status["job"] == "rayjob" and status["total_steps"] == STEPS
    assert 0 <= (status["step"] or 0) <= logged_then
    names = [w["name"] for w in status["workers"]]
    assert names == [w.name for w in plan_job(load_job(job).spec, "rayjob").workers]
    assert all(w["state"] == "running" and w["address"] for w in status["workers"]), status
