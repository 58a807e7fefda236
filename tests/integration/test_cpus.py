"""Thread pools that fit the machine: the CPU limit is read from affinity, the cgroup quota and DVERL_CPUS,
and `dverl run` splits the cores among processes that compute at the same time.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.runtime import cpus
from decentralized_verl.spec.manifest import parse_job


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
