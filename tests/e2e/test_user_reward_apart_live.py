"""A user's reward function never runs in a process holding another role's secrets: a live secured job
(`dverl run`'s cluster: learner and rollout worker as real processes, TLS, a token per role) scores
in the learner (`roles.reward.replicas: 0`), which holds the weight-signing key, with a user reward
(`spy_reward:score`) that records where it runs. Every call ran in a child of the learner with no
`DVERL_*` variable, no socket and no credentials file open, never in the learner itself, and the job trains to
the end."""

from __future__ import annotations

import json
from pathlib import Path

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.security.credentials import run_folder_credentials
from decentralized_verl.spec.manifest import load_job
from tests.support.job_manifests import e2e_manifest

STEPS = 2
SPY = """
import json, os

def score(completion, reference, prompt=None, **options):
    with open(os.environ["SPY_OUT"], "a") as out:
        out.write(json.dumps({
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "dverl": sorted(k for k in os.environ if k.startswith("DVERL_")),
            "fds": sorted(os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
                      if os.path.exists(f"/proc/self/fd/{n}")),
        }) + "\\n")
    return 1.0 if str(reference) in completion else 0.0
"""


def test_a_user_reward_runs_apart_from_the_learners_signing_key(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "spy_reward.py").write_text(SPY)
    spied = tmp_path / "spied.jsonl"
    monkeypatch.setenv("SPY_OUT", str(spied))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    manifest = e2e_manifest(
        tmp_path,
        "apart",
        **{
            "training.steps": STEPS,
            "training.evalEvery": 0,
            "data.rewardType": "spy_reward:score",
            "roles.rollout": {"replicas": 1, "batchSize": 16},
            "roles.reward": {"replicas": 0},
        },
    )
    job = load_job(manifest)
    output = tmp_path / "run"
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    with LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local) as cluster:
        cluster.start()
        learner = cluster.by_role("learner")[0]
        assert learner.process.wait(timeout=600) == 0, learner.log_tail()
        learner_pid = learner.process.pid
    calls = [json.loads(line) for line in spied.read_text().splitlines()]
    assert calls, "the user reward was never called"
    assert {c["pid"] for c in calls}.isdisjoint({learner_pid}), calls[:3]
    assert {c["ppid"] for c in calls} == {learner_pid}  # the learner's own child
    assert all(c["dverl"] == [] for c in calls), calls[0]["dverl"]
    # Its descriptors: its pipes, the learner's log as stderr, its own files; no socket (the learner's
    # handed secrets came on one) and nothing of the run's credentials.
    assert all(not f.startswith("socket:") and "/secrets" not in f for c in calls for f in c["fds"]), calls[0]
    assert [r["step"] for r in read_metrics(output / "metrics.jsonl")] == list(range(1, STEPS + 1))
