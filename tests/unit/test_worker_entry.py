"""`dverl worker` as a pod runs it: the operator's ConfigMap holds a bare spec, the job name comes by flag.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from decentralized_verl.planning.plan import plan_job, worker_env
from decentralized_verl.spec.manifest import parse_spec

SPEC = {
    "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
    "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
    "data": {"train": "x.jsonl", "rewardType": "boxed"},
    "roles": {
        "rollout": {"replicas": 2, "batchSize": 4},
        "learner": {"replicas": 1},
        "reward": {"replicas": 1},
    },
    "training": {"batchSize": 8},
}


def test_plan_env_tells_serving_workers_where_the_learner_is() -> None:
    plan = plan_job(parse_spec(SPEC), "demo")
    addresses = {w.name: f"{w.name}.demo-workers:50051" for w in plan.workers}
    rollout = plan.by_role("rollout")[1]
    env = worker_env(plan, rollout, addresses)
    assert env["DVERL_LEARNER_ADDR"] == "demo-learner-0.demo-workers:50051"
    learner_env = worker_env(plan, plan.by_role("learner")[0], addresses)
    assert learner_env["DVERL_ROLLOUT_ADDRS"].split(",") == [
        "demo-rollout-0.demo-workers:50051",
        "demo-rollout-1.demo-workers:50051",
    ]
    assert learner_env["WORLD_SIZE"] == "1" and learner_env["RANK"] == "0"
    assert learner_env["DVERL_REWARD_ADDRS"] == "demo-reward-0.demo-workers:50051"
