"""`dverl run --ray`: the plan's workers as actors of a real local Ray cluster (one small head for the
module), the tiny GRPO job with rollout, reward and reference workers run through it end to end while
an actor of each role is killed, and `dverl status --ray` reading the job from the cluster.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.support.ray_head import ROOT, dverl_on_ray

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos

# ----------------------------------------------------------------------------------- a real cluster


def test_status_of_a_job_the_cluster_does_not_run_names_it(ray_address: str) -> None:
    result = dverl_on_ray("status", "no-such-job", "--ray", ray_address)
    assert result.returncode == 2
    assert "no job 'no-such-job' on this Ray cluster (jobs running: none)" in result.stderr


def test_run_where_no_ray_cluster_answers_fails_at_once_naming_the_address(tmp_path: Path) -> None:
    from tests.support.processes import free_port

    job = chaos.tiny_job(tmp_path, "nowhere", 2, seed=1)
    address = f"127.0.0.1:{free_port()}"
    result = dverl_on_ray("run", str(job), "-o", str(tmp_path / "run"), "--ray", address)
    assert result.returncode == 2
    assert f"error: --ray {address}: no Ray cluster answers there" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no worker was started anywhere


def test_a_worker_no_ray_node_can_hold_fails_the_run_naming_it_and_places_nothing(
    ray_address: str, tmp_path: Path
) -> None:
    job = chaos.tiny_job(tmp_path, "toobig", 2, seed=1)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["roles"]["reward"]["resources"] = {"cpu": "64"}  # the head has 6
    job.write_text(yaml.safe_dump(doc))
    result = dverl_on_ray("run", str(job), "-o", str(tmp_path / "run"), "--ray", ray_address)
    assert result.returncode == 2, result.stderr
    assert (
        "error: toobig-reward-0: no node of the Ray cluster has CPU 64 (most on a node: 6)" in result.stderr
    )
    status = dverl_on_ray("status", "toobig", "--ray", ray_address)
    assert "no job 'toobig' on this Ray cluster" in status.stderr  # no record, no actor was made
