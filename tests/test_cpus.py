"""Thread pools that fit the machine: the CPU limit is read from affinity, the cgroup quota and DVERL_CPUS,
and `dverl run` splits the cores among processes that compute at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.runtime import cpus
from decentralized_verl.settings import SettingsError, WorkerSettings
from decentralized_verl.spec.manifest import parse_job


@pytest.mark.parametrize(
    ("text", "want"),
    [("400000 100000\n", 4.0), ("150000 100000", 1.5), ("max 100000\n", None), ("", None), ("x y", None),
     ("0 100000", None), ("100000", None)],
)  # fmt: skip
def test_parse_cgroup_v2_cpu_max(text: str, want: float | None) -> None:
    assert cpus.parse_cpu_max(text) == want


def test_parse_cgroup_v1_quota() -> None:
    assert cpus.parse_cfs("200000\n", "100000\n") == 2.0
    assert cpus.parse_cfs("-1", "100000") is None
    assert cpus.parse_cfs("junk", "100000") is None


def test_cgroup_quota_read_from_v2_then_v1(tmp_path: Path) -> None:
    assert cpus.cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpus.cgroup_cpus(tmp_path) == 3.0
    (tmp_path / "cpu.max").write_text("250000 100000")
    assert cpus.cgroup_cpus(tmp_path) == 2.5


def test_available_cpus_takes_the_smallest_limit(tmp_path: Path) -> None:
    machine = cpus.affinity_cpus()

    def given(environ: dict[str, str]) -> float | None:
        return WorkerSettings.from_env(environ).cpus

    assert cpus.available_cpus(given({}), root=tmp_path) == machine
    (tmp_path / "cpu.max").write_text("150000 100000")  # a pod limited to 1.5 CPUs on any node
    assert cpus.available_cpus(given({}), root=tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(machine + 8) * 100000} 100000")  # a quota above the cores
    assert cpus.available_cpus(given({}), root=tmp_path) == machine
    assert cpus.available_cpus(given({"DVERL_CPUS": "1"}), root=tmp_path) == 1
    assert cpus.available_cpus(given({"DVERL_CPUS": "0.3"}), root=tmp_path) == 1  # never zero threads
    with pytest.raises(SettingsError, match="DVERL_CPUS"):
        given({"DVERL_CPUS": "-2"})


def test_share_cores_by_phase() -> None:
    workers = [
        ("l0", "learner"),
        ("r0", "rollout"),
        ("r1", "rollout"),
        ("ref", "reference"),
        ("rw", "reward"),
    ]
    on_policy = cpus.share_cores(12, workers, overlapped=False)
    assert on_policy == {"l0": 12, "r0": 4, "r1": 4, "ref": 4, "rw": 1}
    overlapped = cpus.share_cores(12, workers, overlapped=True)
    assert overlapped == {"l0": 3, "r0": 3, "r1": 3, "ref": 3, "rw": 1}
    assert cpus.share_cores(2, workers, overlapped=True)["r0"] == 1  # more processes than cores: one each
    two_learners = cpus.share_cores(8, [("l0", "learner"), ("l1", "learner")], overlapped=False)
    assert two_learners == {"l0": 4, "l1": 4}


def test_a_worker_process_sizes_torch_from_dverl_cpus() -> None:
    code = (
        "import torch; from decentralized_verl.runtime.cpus import configure_from_environment as c; "
        "from decentralized_verl.settings import WorkerSettings; "
        "n = c(WorkerSettings.from_env()); "
        "print(n, torch.get_num_threads(), __import__('os').environ['OMP_NUM_THREADS'])"
    )
    env = {**os.environ, "DVERL_CPUS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1"]


JOB = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "t"},
    "spec": {
        "model": {"tiny": {}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "x.jsonl", "rewardType": "boxed"},
        "roles": {
            "rollout": {"replicas": 2, "batchSize": 2},
            "learner": {"replicas": 1},
            "reward": {"replicas": 1},
            "reference": {"replicas": 1},
        },
        "training": {"batchSize": 4},
    },
}


def test_dverl_run_gives_each_process_its_share(tmp_path: Path) -> None:
    spec = parse_job(JOB).spec
    plan = plan_job(spec, "t")
    cluster = LocalCluster(plan, tmp_path / "job.yaml", tmp_path, cores=6)
    env = {name: cluster.env_for(lw) for name, lw in cluster.workers.items()}
    assert {name: e["DVERL_CPUS"] for name, e in env.items()} == {
        "t-learner-0": "6", "t-rollout-0": "2", "t-rollout-1": "2", "t-reference-0": "2", "t-reward-0": "1",
    }  # fmt: skip
    assert all(e["OMP_NUM_THREADS"] == e["DVERL_CPUS"] for e in env.values())
    overlapped = LocalCluster(plan, tmp_path / "job.yaml", tmp_path, overlapped=True, cores=6)
    assert overlapped.env_for(overlapped.workers["t-learner-0"])["DVERL_CPUS"] == "1"
    assert LocalCluster(plan, tmp_path / "job.yaml", tmp_path).cores["t-learner-0"] == cpus.available_cpus()
