"""`dverl run --ray`: the plan's workers as actors of a real local Ray cluster (one small head for the
module), the tiny GRPO job with rollout, reward and reference workers run through it end to end while
an actor of each role is killed, and `dverl status --ray` reading the job from the cluster.

The tiny job's steps take a fraction of a second, less than one call to the cluster on a busy machine: the
test holds the learner (SIGSTOP, SIGCONT) while it reads the status and while it kills, so each kill lands
while the job still runs, at the step it was meant for or just after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ray_head import ROOT, ray_head

from decentralized_verl.launch.ray_placement import (
    PlacementError,
    actor_options,
    cpu_count,
    learner_gang,
)
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import load_job

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos

STEPS = 16
"""Ten steps after the last kill: the learner's status is read once its first step is on the record, which
lags the learner by the supervisor's poll, and the job must still be running then."""
KILLS = {2: "rollout", 3: "reward", 5: "reference", 6: "learner"}
"""Step reached -> role whose actor is killed then (rollout-1, the others' only worker)."""
PROCESS_KILL_AT = 4
"""Step at which rollout-0's worker process (not its actor) is SIGKILLed: restarted inside its actor."""


# ------------------------------------------------------------------------------------------ placement
def _plan(tmp_path: Path, roles: dict) -> object:
    job = chaos.tiny_job(tmp_path, "place", 2, seed=1)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["roles"].update(roles)
    doc["spec"]["training"]["batchSize"] = 8  # two learners split the 16 prompts the rollouts make
    job.write_text(yaml.safe_dump(doc))
    spec = load_job(job)
    return plan_job(spec.spec, "place")


def test_each_worker_asks_ray_for_its_roles_resources_and_pool(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        {
            "learner": {
                "replicas": 2,
                "nodePools": [
                    {"name": "big", "replicas": 1, "gpuType": "a100", "nodeSelector": {"pool": "big"},
                     "resources": {"cpu": "4", "memory": "16Gi", "gpus": 1}},
                    {"name": "small", "replicas": 1, "resources": {"cpu": "500m", "gpus": 1}},
                ],
            },
            "reward": {"replicas": 1, "resources": {"cpu": "250m", "memory": "1Gi"}},
        },
    )  # fmt: skip
    learner0, learner1 = plan.by_role("learner")
    assert actor_options(learner0) == {
        "num_cpus": 4.0,
        "num_gpus": 1,
        "memory": 16 * 2**30,
        "accelerator_type": "a100",
        "label_selector": {"pool": "big"},
    }
    assert actor_options(learner1) == {"num_cpus": 0.5, "num_gpus": 1}
    assert actor_options(plan.by_role("reward")[0]) == {"num_cpus": 0.25, "num_gpus": 0, "memory": 2**30}
    assert actor_options(plan.by_role("rollout")[0]) == {"num_cpus": 1.0, "num_gpus": 0}
    gang = learner_gang(plan)
    assert gang.strategy == "STRICT_SPREAD"  # two pools: two kinds of node
    big = {"CPU": 4.0, "GPU": 1.0, "memory": float(16 * 2**30), "accelerator_type:a100": 0.001}
    assert gang.bundles == (big, {"CPU": 0.5, "GPU": 1.0})
    assert gang.label_selectors == ({"pool": "big"}, {})
    one_pool = learner_gang(_plan(tmp_path, {"learner": {"replicas": 2}}))
    assert one_pool.strategy == "PACK" and one_pool.bundles == ({"CPU": 1.0}, {"CPU": 1.0})
    assert one_pool.label_selectors == ()


def test_a_quantity_ray_cannot_take_names_the_worker() -> None:
    from decentralized_verl.planning.plan import PlannedWorker

    worker = PlannedWorker(job="j", role="reward", index=0, cpu="1", memory="lots")
    with pytest.raises(PlacementError, match=r"j-reward-0: resources: .*'lots'"):
        actor_options(worker)
    assert cpu_count("1500m") == 1.5 and cpu_count(None) == 1.0 and cpu_count("2k") == 2000.0
    tiny = PlannedWorker(job="j", role="rollout", index=1, memory="500m")
    with pytest.raises(PlacementError, match=r"j-rollout-1: resources: memory '500m' is less than one byte"):
        actor_options(tiny)


# ----------------------------------------------------------------------------------- a real cluster
@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> str:
    with ray_head(tmp_path_factory.mktemp("ray")) as head:
        yield head


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / "worker_image"), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _dverl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _steps_done(output: Path) -> int:
    """The newest step the learner has finished, from the metrics it writes as each one ends (not the
    supervisor's record, which waits while the supervisor restarts workers)."""
    with contextlib.suppress(OSError):
        text = (output / "metrics.jsonl").read_text()
        lines = text.split("\n")[:-1]  # a line still being written is left for the next look
        return max((int(json.loads(line)["step"]) for line in lines if line.strip()), default=0)
    return 0


@contextlib.contextmanager
def _learner_held(ray, job: str) -> Iterator[None]:
    """The learner's process stopped (SIGSTOP, through its actor, as a chaos test would) while the body
    runs, so the job cannot move on meanwhile; continued after, unless it was killed meanwhile."""
    learner = ray.get_actor(f"{job}-learner-0")
    ray.get(learner.signal.remote(signal.SIGSTOP), timeout=60)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, ray.exceptions.RayActorError):
            ray.get(ray.get_actor(f"{job}-learner-0").signal.remote(signal.SIGCONT), timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_job_runs_on_ray_survives_a_killed_actor_of_each_role_and_shows_in_status(
    address: str, tmp_path: Path
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
                address,
            ],
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ray.init(address=address, namespace="dverl", log_to_driver=False)
    killed: dict[str, int] = {}
    status_seen = None
    try:
        deadline = time.monotonic() + 800
        while run.poll() is None and time.monotonic() < deadline:
            if status_seen is None:
                # Read while the job holds still, past its first step and before any kill: every worker runs.
                try:
                    state = ray.get(ray.get_actor("rayjob-job").read.remote(), timeout=60)
                except (ValueError, ray.exceptions.RayActorError):
                    state = {}
                if (state.get("step") or 0) >= 1:
                    with _learner_held(ray, "rayjob"):
                        status_seen = _dverl("status", "rayjob", "--ray", address, "--json")
                else:
                    time.sleep(0.05)
                continue
            step = _steps_done(output)
            process_due = step >= PROCESS_KILL_AT and "process" not in killed
            due = {role: at for at, role in KILLS.items() if step >= at and role not in killed}
            if not (due or process_due):
                time.sleep(0.05)
                continue
            with _learner_held(ray, "rayjob"):
                if process_due:
                    actor = ray.get_actor("rayjob-rollout-0")
                    pid = ray.get(actor.pid.remote(), timeout=60)
                    ray.get(actor.signal.remote(signal.SIGKILL), timeout=60)
                    killed["process"] = pid
                for role in due:
                    name = f"rayjob-{role}-{1 if role == 'rollout' else 0}"
                    ray.kill(ray.get_actor(name))  # the actor, and with it its worker process
                    killed[role] = step
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()[-4000:]
        leftover = [
            a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "rayjob" in a["name"]
        ]
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(60)
        ray.shutdown()
    assert set(killed) == {*KILLS.values(), "process"}, killed
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
    assert status["job"] == "rayjob" and status["step"] >= 1 and status["total_steps"] == STEPS
    names = [w["name"] for w in status["workers"]]
    assert names == [w.name for w in plan_job(load_job(job).spec, "rayjob").workers]
    assert all(w["state"] == "running" and w["address"] for w in status["workers"]), status


def test_status_of_a_job_the_cluster_does_not_run_names_it(address: str) -> None:
    result = _dverl("status", "no-such-job", "--ray", address)
    assert result.returncode == 2
    assert "no job 'no-such-job' on this Ray cluster (jobs running: none)" in result.stderr


def test_run_where_no_ray_cluster_answers_fails_at_once_naming_the_address(tmp_path: Path) -> None:
    from processes import free_port

    job = chaos.tiny_job(tmp_path, "nowhere", 2, seed=1)
    address = f"127.0.0.1:{free_port()}"
    result = _dverl("run", str(job), "-o", str(tmp_path / "run"), "--ray", address)
    assert result.returncode == 2
    assert f"error: --ray {address}: no Ray cluster answers there" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no worker was started anywhere


def test_the_run_certificate_names_every_ray_node(tmp_path: Path) -> None:
    from decentralized_verl.security.credentials import CERT_FILE, certificate_ips, run_folder_credentials

    local = run_folder_credentials(tmp_path, "job", hosts=["10.0.0.5", "10.0.0.6"])
    assert certificate_ips(local.issued.cert) == {"127.0.0.1", "10.0.0.5", "10.0.0.6"}
    assert (local.folder / CERT_FILE).read_bytes() == local.issued.cert  # what every process reads
    again = run_folder_credentials(tmp_path, "job", hosts=["10.0.0.5"])
    assert again.issued.verify_key != local.issued.verify_key  # a resumed run is handed fresh credentials
    assert certificate_ips(again.issued.cert) == {"127.0.0.1", "10.0.0.5"}


def test_a_worker_no_ray_node_can_hold_fails_the_run_naming_it_and_places_nothing(
    address: str, tmp_path: Path
) -> None:
    job = chaos.tiny_job(tmp_path, "toobig", 2, seed=1)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["roles"]["reward"]["resources"] = {"cpu": "64"}  # the head has 6
    job.write_text(yaml.safe_dump(doc))
    result = _dverl("run", str(job), "-o", str(tmp_path / "run"), "--ray", address)
    assert result.returncode == 2, result.stderr
    assert (
        "error: toobig-reward-0: no node of the Ray cluster has CPU 64 (most on a node: 6)" in result.stderr
    )
    status = _dverl("status", "toobig", "--ray", address)
    assert "no job 'toobig' on this Ray cluster" in status.stderr  # no record, no actor was made


def test_unplaceable_names_each_worker_and_what_it_lacks(tmp_path: Path) -> None:
    from decentralized_verl.launch.ray_placement import unplaceable

    plan = _plan(tmp_path, {"reward": {"replicas": 1, "resources": {"cpu": "2", "gpus": 1}}})
    nodes = [{"CPU": 8.0, "memory": 1e10}, {"CPU": 1.0, "GPU": 1.0}]
    assert unplaceable(plan, nodes) == [
        "place-reward-0: no node of the Ray cluster has all of {'CPU': 2.0, 'GPU': 1.0}"
    ]  # CPUs on one node, the GPU on another: neither holds both
    assert unplaceable(plan, [{"CPU": 8.0, "GPU": 2.0}]) == []
    assert unplaceable(plan, [{"CPU": 8.0}]) == [
        "place-reward-0: no node of the Ray cluster has GPU 1 (most on a node: 0)"
    ]


def test_status_text_lists_each_worker_with_its_state_address_and_restarts() -> None:
    from decentralized_verl.launch.ray_status import format_status

    status = {
        "job": "j",
        "step": 3,
        "total_steps": 8,
        "phase": "rollout",
        "output": "/runs/j",
        "workers": [
            {"name": "j-learner-0", "state": "running", "address": "10.0.0.3:4000", "restarts": 1},
            {"name": "j-rollout-0", "state": "actor lost", "address": None, "restarts": 0},
        ],
    }
    lines = format_status(status).splitlines()
    assert lines[0] == "j: step 3/8 (rollout); run folder /runs/j"
    assert lines[1].split() == ["j-learner-0", "running", "10.0.0.3:4000", "restarts", "1"]
    assert lines[2].split() == ["j-rollout-0", "actor", "lost", "-", "restarts", "0"]
    assert format_status({**status, "step": None}).startswith("j: starting;")
