"""The learner's training metrics on a Prometheus endpoint: real HTTP scrapes of the exporter, the plan
giving learner rank 0 a `metrics` port (and only in a cluster), the operator's pod exposing it.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from decentralized_verl.planning.plan import METRICS_PORT, plan_job, worker_env
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.objects import owned
from dverl_operator.reconcile.desired import for_job
from tests.support.operator_fixtures import tiny_spec


def test_learner_rank_0_gets_a_metrics_port_in_a_cluster_and_none_locally() -> None:
    spec = parse_spec(tiny_spec(roles={"learner": {"replicas": 2}, "rollout": {"replicas": 2}}))
    plan = plan_job(spec, "j")
    first, second = plan.by_role("learner")
    assert first.ports["metrics"] == METRICS_PORT and "metrics" not in second.ports
    assert all("metrics" not in w.ports for w in plan.by_role("rollout"))
    addresses = {w.name: f"{w.name}:50051" for w in plan.workers}
    env = worker_env(plan, first, addresses)
    assert WorkerSettings.from_env(env).metrics_port == METRICS_PORT
    assert "DVERL_METRICS_PORT" not in worker_env(plan, second, addresses)
    local = {**addresses, f"{first.name}/metrics": "0"}  # what `dverl run` supplies
    assert "DVERL_METRICS_PORT" not in worker_env(plan, first, local)


def test_the_learner_pod_exposes_and_announces_the_port() -> None:
    spec = parse_spec(tiny_spec())
    plan = plan_job(spec, "j")
    want = for_job(owned.Owner("j", "ns", "u-1"), spec, plan, "img:1")
    learner = want.pods["j-learner-0"]
    ports = {p["name"]: p["containerPort"] for p in learner["spec"]["containers"][0]["ports"]}
    assert ports["metrics"] == METRICS_PORT
    annotations = learner["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    rollout = want.pods["j-rollout-0"]
    assert "prometheus.io/scrape" not in rollout["metadata"]["annotations"]
