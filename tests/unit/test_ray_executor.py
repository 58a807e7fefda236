"""`dverl run --ray`: the plan's workers as actors of a real local Ray cluster (one small head for the
module), the tiny GRPO job with rollout, reward and reference workers run through it end to end while
an actor of each role is killed, and `dverl status --ray` reading the job from the cluster.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from decentralized_verl.launch.ray_placement import (
    PlacementError,
    actor_options,
    cpu_count,
    learner_gang,
)
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import load_job
from tests.support.ray_head import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos

"""Step the learner has logged -> what is killed then: a role's actor (rollout-1, the others' only worker),
or, for "process", rollout-0's worker process alone (restarted inside its actor)."""


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


def test_the_run_certificate_names_every_ray_node(tmp_path: Path) -> None:
    from decentralized_verl.security.credentials import CERT_FILE, certificate_ips, run_folder_credentials

    local = run_folder_credentials(tmp_path, "job", hosts=["10.0.0.5", "10.0.0.6"])
    assert certificate_ips(local.issued.cert) == {"127.0.0.1", "10.0.0.5", "10.0.0.6"}
    assert (local.folder / CERT_FILE).read_bytes() == local.issued.cert  # what every process reads
    again = run_folder_credentials(tmp_path, "job", hosts=["10.0.0.5"])
    assert again.issued.verify_key != local.issued.verify_key  # a resumed run is handed fresh credentials
    assert certificate_ips(again.issued.cert) == {"127.0.0.1", "10.0.0.5"}


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
