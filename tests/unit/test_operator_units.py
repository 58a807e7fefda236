"""The operator's pure core: children, the reconcile decision, status helpers, Lease arithmetic, flags.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

import pytest

from decentralized_verl.core.status import JobStatus
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.transport.wire.status import job_status_from_proto
from dverl_operator.children.services import gateway_address, gateway_service
from dverl_operator.flags import parser, reconcile_settings
from dverl_operator.jobs.coordinator import DEFAULT_TEMPLATE, CoordinatorClient
from dverl_operator.logs import JsonFormatter
from dverl_operator.objects import owned
from dverl_operator.objects.times import timestamp
from dverl_operator.pods import marks as pod_marks
from dverl_operator.pods.decisions import ANNOTATION_FAILED_AT, ANNOTATION_FAILURE_COUNTED, backoff_delay
from dverl_operator.process.leader import may_acquire, micro_time
from dverl_operator.reconcile.decide import decide
from dverl_operator.reconcile.desired import for_job
from dverl_operator.reconcile.observed import Observed
from dverl_operator.reconcile.settings import Settings
from dverl_operator.status import conditions as cond
from dverl_operator.status.fields import role_counts, workers_column
from dverl_operator.status.merge import merge_patch
from tests.support.cluster_world import running
from tests.support.operator_fixtures import tiny_spec
from tests.support.paths import ROOT

SETTINGS = Settings(default_image="img:1", backoff_base_seconds=10, backoff_max_seconds=60)
NOW = 1_800_000_000.0


def job(spec, name="j", status=None, **meta):
    return {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1", **meta},
        "spec": spec,
        "status": status or {},
    }


def desired(spec_dict, name="j"):
    spec = parse_spec(spec_dict)
    plan = plan_job(spec, name)
    marks = pod_marks.for_job(spec, {"metadata": {"name": name}}, plan, None)
    return for_job(owned.Owner(name, "ns", "u-1"), spec, plan, "img:1", marks=marks)


def observed(
    spec_dict, pods=None, status=None, config_map=None, service=None, progress=None, now=NOW, **meta
):
    return Observed(
        job=job(spec_dict, status=status, **meta),
        pods=pods or {},
        config_map=config_map,
        service=service,
        progress=progress,
        now=now,
    )


def failed(pod, **annotations):
    meta = {**pod["metadata"], "annotations": {**pod["metadata"].get("annotations", {}), **annotations}}
    return {**pod, "metadata": meta, "status": {"phase": "Failed"}}


def created_names(actions):
    return sorted(o["metadata"]["name"] for o in actions.create)


# ------------------------------------------------------------------------------------------ children
def test_children_names_labels_and_service_ports():
    want = desired(tiny_spec(volunteers={"enabled": True, "tokenSecretRef": {"name": "s"}}))
    assert list(want.pods) == ["j-learner-0", "j-rollout-0", "j-rollout-1", "j-dht-0"]
    assert want.config_map["metadata"]["name"] == "j-config"
    ports = {(p["name"], p["port"]) for p in want.service["spec"]["ports"]}
    assert ports == {("grpc", 50051), ("dist", 29500), ("dht", 31337), ("metrics", 9400)}
    assert want.pods["j-dht-0"]["spec"]["containers"][0]["command"][:2] == ["dverl", "dht"]


def test_tensor_parallel_rollout_pods_request_all_their_gpus():
    """A vllm rollout worker with resources.gpus N runs its engine over N GPUs (tensor_parallel_size N), so
    its pod asks for N; the learner asks only for its own, and a pool's resources replace the role's."""
    rollout = {
        "replicas": 3,
        "backend": "vllm",
        "resources": {"gpus": 2},
        "nodePools": [
            {"name": "big", "replicas": 1, "resources": {"gpus": 4, "memory": "64Gi"}},
            {"name": "two", "replicas": 2},
        ],
    }
    want = desired(
        tiny_spec(roles={"rollout": rollout, "learner": {"replicas": 1, "resources": {"gpus": 1}}})
    )

    def gpus(pod_name):
        resources = want.pods[pod_name]["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]  # GPUs can only be asked for as limits = requests
        return resources["limits"]

    assert gpus("j-rollout-0") == {"nvidia.com/gpu": "4", "memory": "64Gi"}
    assert gpus("j-rollout-1") == gpus("j-rollout-2") == {"nvidia.com/gpu": "2"}
    assert gpus("j-learner-0") == {"nvidia.com/gpu": "1"}


def test_template_hash_ignores_serving_addresses_but_not_learner_world_size():
    a = desired(tiny_spec(training={"steps": 5, "batchSize": 1}))
    b = desired(
        tiny_spec(
            roles={"rollout": {"replicas": 4}, "learner": {"replicas": 1}},
            training={"steps": 5, "batchSize": 1},
        )
    )
    h = owned.ANNOTATION_TEMPLATE_HASH
    # More rollout workers: the learner's address list grows, but the learner is not replaced.
    assert (
        a.pods["j-learner-0"]["metadata"]["annotations"][h]
        == b.pods["j-learner-0"]["metadata"]["annotations"][h]
    )
    c = desired(
        tiny_spec(
            roles={"rollout": {"replicas": 2}, "learner": {"replicas": 2}},
            training={"steps": 5, "batchSize": 1},
        )
    )
    # Another learner: WORLD_SIZE changes, so rank 0 must restart with the gang.
    assert (
        a.pods["j-learner-0"]["metadata"]["annotations"][h]
        != c.pods["j-learner-0"]["metadata"]["annotations"][h]
    )


def test_scheduler_name_and_gang_annotations_pass_through():
    want = desired(tiny_spec(schedulerName="volcano", podAnnotations={"scheduling.k8s.io/group-name": "j"}))
    pod = want.pods["j-rollout-0"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "j"


# ------------------------------------------------------------------------------------------ decide
def test_fresh_job_creates_everything_once():
    actions = decide(observed(tiny_spec()), SETTINGS)
    assert created_names(actions) == ["j-config", "j-learner-0", "j-rollout-0", "j-rollout-1", "j-workers"]
    assert actions.issue_credentials  # the Secret is issued where actions are applied, before the pods
    assert actions.status["phase"] == "Pending" and actions.status["workers"] == "0/3"
    # Applying it and deciding again: nothing to do (idempotent).
    want = desired(tiny_spec())
    again = decide(
        observed(
            tiny_spec(),
            pods=want.pods,
            config_map=want.config_map,
            service=want.service,
            status=actions.status,
        ),
        SETTINGS,
    )
    assert (again.create, again.delete, again.patch) == ([], [], [])
    assert merge_patch(actions.status, again.status) == {}
    known = Observed(**{**again_observed(want, actions).__dict__, "credentials_ready": True})
    assert not decide(known, SETTINGS).issue_credentials


def again_observed(want, actions):
    return observed(
        tiny_spec(), pods=want.pods, config_map=want.config_map, service=want.service, status=actions.status
    )


def test_invalid_spec_creates_nothing_and_reports_paths():
    bad = tiny_spec(roles={"rollout": {"replicas": -1}, "learner": {"replicas": 1}})
    actions = decide(observed(bad), SETTINGS)
    assert actions.create == [] and actions.delete == []
    assert actions.status["phase"] == "Failed"
    (cond,) = [c for c in actions.status["conditions"] if c["type"] == "ValidationFailed"]
    assert "spec.roles.rollout.replicas: must be >= 0 (got -1)" in cond["message"]
    assert [e[1] for e in actions.events] == ["ValidationFailed"]
    # Same problem next pass: no second Event.
    assert decide(observed(bad, status=actions.status), SETTINGS).events == []


def test_backoff_delays_double_and_cap():
    assert [
        backoff_delay(n, SETTINGS.backoff_base_seconds, SETTINGS.backoff_max_seconds) for n in range(6)
    ] == [0, 10, 20, 40, 60, 60]


def test_failed_pod_counted_once_then_restarted_after_backoff():
    want = desired(tiny_spec())
    pods = {n: running(p) for n, p in want.pods.items()}
    pods["j-rollout-0"] = failed(pods["j-rollout-0"])
    base = dict(config_map=want.config_map, service=want.service)
    first = decide(observed(tiny_spec(), pods=pods, **base), SETTINGS)
    assert first.status["roles"]["rollout"]["restarts"] == 1
    marks = {ANNOTATION_FAILURE_COUNTED: "true", ANNOTATION_FAILED_AT: f"{NOW:.3f}"}
    assert first.patch == [("Pod", "j-rollout-0", {"metadata": {"annotations": marks}})]
    assert first.delete == [] and first.requeue_after == pytest.approx(10)
    counted = failed(pods["j-rollout-0"], **{ANNOTATION_FAILURE_COUNTED: "true",
                                             ANNOTATION_FAILED_AT: f"{NOW:.3f}"})  # fmt: skip
    pods["j-rollout-0"] = counted
    during = decide(observed(tiny_spec(), pods=pods, status=first.status, now=NOW + 5, **base), SETTINGS)
    assert during.delete == [] and during.patch == [] and during.status["roles"]["rollout"]["restarts"] == 1
    after = decide(observed(tiny_spec(), pods=pods, status=first.status, now=NOW + 10.5, **base), SETTINGS)
    assert after.delete == [("Pod", "j-rollout-0")] and after.status["roles"]["rollout"]["restarts"] == 1


def test_past_backoff_limit_fails_the_job_and_removes_pods():
    spec = tiny_spec(backoffLimit=1)
    want = desired(spec)
    pods = {n: running(p) for n, p in want.pods.items()}
    pods["j-rollout-1"] = failed(pods["j-rollout-1"])
    status = {"roles": {"rollout": {"ready": 1, "desired": 2, "restarts": 1}}}
    actions = decide(
        observed(spec, pods=pods, status=status, config_map=want.config_map, service=want.service), SETTINGS
    )
    assert actions.status["phase"] == "Failed"
    assert sorted(n for _, n in actions.delete) == sorted(want.pods)
    (cond,) = [c for c in actions.status["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "BackoffLimitExceeded" and "rollout=2" in cond["message"]
    # Terminal: the next pass changes nothing but keeps pods away.
    later = decide(observed(spec, status=actions.status, config_map=want.config_map), SETTINGS)
    assert later.create == [] and later.status["phase"] == "Failed"


def test_missing_learner_restarts_whole_gang():
    spec = tiny_spec(
        roles={"rollout": {"replicas": 2}, "learner": {"replicas": 3}}, training={"steps": 5, "batchSize": 1}
    )
    spec["roles"]["rollout"]["batchSize"] = 3
    want = desired(spec)
    pods = {n: running(p) for n, p in want.pods.items() if n != "j-learner-2"}
    base = dict(config_map=want.config_map, service=want.service)
    actions = decide(observed(spec, pods=pods, **base), SETTINGS)
    assert sorted(n for _, n in actions.delete) == ["j-learner-0", "j-learner-1"]
    assert actions.create == []  # the new gang starts only once every old rank is gone
    rest = {n: p for n, p in pods.items() if "learner" not in n}
    actions = decide(observed(spec, pods=rest, **base), SETTINGS)
    assert created_names(actions) == ["j-learner-0", "j-learner-1", "j-learner-2"]


def test_model_change_refused_while_pods_run_but_allowed_when_suspending():
    old = tiny_spec()
    want = desired(old)
    pods = {n: running(p) for n, p in want.pods.items()}
    new = tiny_spec(model={"tiny": {"hiddenSize": 128}})
    base = dict(pods=pods, config_map=want.config_map, service=want.service)
    actions = decide(observed(new, **base), SETTINGS)
    assert actions.delete == [] and actions.create == [] and actions.patch == []
    (cond,) = [c for c in actions.status["conditions"] if c["type"] == "SpecChangeRefused"]
    assert "spec.model" in cond["message"]
    suspending = decide(observed({**new, "suspend": True}, **base), SETTINGS)
    assert sorted(n for _, n in suspending.delete) == sorted(want.pods)
    assert [p[0] for p in suspending.patch] == ["ConfigMap"]
    assert suspending.status["phase"] == "Suspended"


def test_coordinator_success_completes_the_job():
    want = desired(tiny_spec())
    pods = {n: running(p) for n, p in want.pods.items()}
    actions = decide(
        observed(tiny_spec(), pods=pods, config_map=want.config_map, service=want.service,
                 progress=JobStatus(step=10, total_steps=10, state="Succeeded", reward_mean=0.9)),
        SETTINGS,
    )  # fmt: skip
    assert actions.status["phase"] == "Succeeded" and actions.status["step"] == 10
    assert sorted(n for _, n in actions.delete) == ["j-rollout-0", "j-rollout-1"]  # learner 0 kept for logs


# ------------------------------------------------------------------------------------------ status
def test_condition_transition_time_moves_only_on_flip():
    conds = cond.set_condition([], "Ready", "False", "A", "m", NOW)
    same = cond.set_condition(conds, "Ready", "False", "B", "m2", NOW + 60)
    assert same[0]["lastTransitionTime"] == conds[0]["lastTransitionTime"] and same[0]["reason"] == "B"
    flipped = cond.set_condition(same, "Ready", "True", "C", "", NOW + 120)
    assert flipped[0]["lastTransitionTime"] == timestamp(NOW + 120)


def test_merge_patch_against_reference():
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1], "gone": 1}
    new = {"a": 1, "b": {"c": 2, "d": 4}, "e": [1, 2], "f": {"g": 1}}
    patch = merge_patch(old, new)
    assert patch == {"gone": None, "b": {"d": 4}, "e": [1, 2], "f": {"g": 1}}

    def apply(doc, p):  # RFC 7386, written out independently
        out = dict(doc)
        for k, v in p.items():
            if v is None:
                out.pop(k, None)
            elif isinstance(v, dict):
                out[k] = apply(out.get(k) if isinstance(out.get(k), dict) else {}, v)
            else:
                out[k] = v
        return out

    assert apply(old, patch) == new
    assert merge_patch(new, new) == {}


def test_role_counts_need_running_and_ready():
    def pod(phase, ready=None):
        conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
        return {
            "metadata": {"labels": {owned.LABEL_ROLE: "rollout"}},
            "status": {"phase": phase, "conditions": conditions},
        }

    pods = [pod("Running", "True"), pod("Running", "False"), pod("Pending")]
    roles = role_counts({"rollout": 3, "learner": 1}, pods, {"rollout": 2})
    assert roles == {
        "rollout": {"ready": 1, "desired": 3, "restarts": 2},
        "learner": {"ready": 0, "desired": 1, "restarts": 0},
    }
    assert workers_column(roles) == "1/4"


# ------------------------------------------------------------------------------------------ leader
def test_lease_may_be_taken_only_when_free_ours_or_expired():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
    fresh = {
        "spec": {
            "holderIdentity": "b",
            "leaseDurationSeconds": 15,
            "renewTime": micro_time(now - datetime.timedelta(seconds=5)),
        }
    }
    stale = {
        "spec": {
            "holderIdentity": "b",
            "leaseDurationSeconds": 15,
            "renewTime": micro_time(now - datetime.timedelta(seconds=16)),
        }
    }
    assert may_acquire(None, "a", now)
    assert not may_acquire(fresh, "a", now)
    assert may_acquire(fresh, "b", now)
    assert may_acquire(stale, "a", now)
    assert may_acquire({"spec": {}}, "a", now)


# ------------------------------------------------------------------------------- flags, logs, misc
def test_flags():
    args = parser().parse_args(["--namespace", "a", "--namespace", "b", "--metrics-port", "0"])
    assert args.namespace == ["a", "b"] and not args.all_namespaces and args.metrics_port == 0
    assert parser().parse_args(["--all-namespaces"]).all_namespaces
    with pytest.raises(SystemExit):
        parser().parse_args(["--all-namespaces", "--namespace", "x"])


def test_json_logs_carry_extras():
    record = logging.makeLogRecord(
        {"msg": "hi %s", "args": ("there",), "levelname": "INFO", "name": "x", "job": "j1"}
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "hi there" and entry["job"] == "j1" and entry["level"] == "info"


def test_coordinator_address_template_and_reply_mapping():
    from decentralized_verl.proto import dverl_pb2

    assert CoordinatorClient(DEFAULT_TEMPLATE).address("j", "ns") == "j-learner-0.j-workers.ns.svc:50051"
    progress = job_status_from_proto(
        dverl_pb2.JobStatus(step=3, reward_mean=0.5, policy_version=3, volunteers=2, state="Running")
    )
    assert (progress.step, progress.reward_mean, progress.policy_version, progress.eval_accuracy) == (
        3,
        0.5,
        3,
        None,
    )


def test_the_operator_extra_installs_what_the_operator_imports():
    """Every third-party package a dverl_operator module imports is in the `operator` extra or the core
    dependencies, and the extra lists nothing the operator does not import."""
    import ast
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = ROOT
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extra = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["operator"]}
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    modules: set[str] = set()
    for path in (root / "operator" / "dverl_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"decentralized_verl", "dverl_operator"}
    # A module may come from several distributions (lightkube-models installs into lightkube.models).
    found = importlib.metadata.packages_distributions()
    providers = {m: {canonicalize_name(d) for d in found[m]} for m in third_party}
    missing = sorted(m for m, names in providers.items() if not names & (core | extra))
    assert missing == [], "the operator imports these but the operator extra lacks them"
    unused = extra - set().union(*providers.values())
    assert unused == set(), "the operator extra installs these but the operator never imports them"


def test_learner_pods_resume_and_mount_the_checkpoint_pvc() -> None:
    from decentralized_verl.planning.plan import plan_job
    from decentralized_verl.spec.manifest import parse_spec
    from dverl_operator.objects.owned import Owner
    from dverl_operator.reconcile.desired import for_job

    spec = parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "/data/train.jsonl"},
            "training": {
                "batchSize": 8,
                "checkpoint": {"every": 10, "dir": "/ckpt", "persistentVolumeClaim": "runs"},
            },
        }
    )
    children = for_job(Owner("job", "ns", "uid-1"), spec, plan_job(spec, "job"), "img")
    learner = children.pods["job-learner-0"]["spec"]
    rollout = children.pods["job-rollout-0"]["spec"]
    assert learner["containers"][0]["command"][-1] == "--resume"
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in learner["containers"][0]["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "runs"}} in learner["volumes"]
    assert {"name": "DVERL_OUTPUT", "value": "/ckpt"} in learner["containers"][0]["env"]
    assert "--resume" not in rollout["containers"][0]["command"]
    assert all(v["name"] != "checkpoints" for v in rollout["volumes"])


def test_only_the_learner_gets_the_join_secret_from_the_named_secret() -> None:
    from decentralized_verl.planning.plan import plan_job
    from decentralized_verl.spec.manifest import parse_spec
    from dverl_operator.objects.owned import Owner
    from dverl_operator.reconcile.desired import for_job

    spec = parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "/data/train.jsonl"},
            "training": {"batchSize": 8},
            "volunteers": {"enabled": True, "tokenSecretRef": {"name": "job-join", "key": "secret"}},
        }
    )
    children = for_job(Owner("job", "ns", "uid-1"), spec, plan_job(spec, "job"), "img")
    learner_env = children.pods["job-learner-0"]["spec"]["containers"][0]["env"]
    assert {
        "name": "DVERL_JOIN_SECRET",
        "valueFrom": {"secretKeyRef": {"name": "job-join", "key": "secret"}},
    } in learner_env
    for name, pod in children.pods.items():
        if name != "job-learner-0":
            assert all(e["name"] != "DVERL_JOIN_SECRET" for e in pod["spec"]["containers"][0]["env"]), name


# ------------------------------------------------------------------------------ volunteer gateway
VOLUNTEERS = {"enabled": True, "tokenSecretRef": {"name": "join", "key": "secret"}}
GATEWAY = Settings(default_image="img:1", volunteer_gateway=True, volunteer_service_type="LoadBalancer")


def test_gateway_only_for_volunteer_jobs_and_only_when_the_chart_enables_it():
    vol = tiny_spec(volunteers=VOLUNTEERS)
    created = {o["metadata"]["name"]: o for o in decide(observed(vol), GATEWAY).create}
    gateway = created["j-volunteers"]
    assert gateway["spec"]["type"] == "LoadBalancer"
    assert gateway["spec"]["selector"] == {"dverl.io/job": "j", "dverl.io/role": "dht"}
    assert "j-volunteers" not in {o["metadata"]["name"] for o in decide(observed(vol), SETTINGS).create}
    plain = decide(observed(tiny_spec()), GATEWAY)
    assert "j-volunteers" not in {o["metadata"]["name"] for o in plain.create}


def test_gateway_type_change_is_patched_and_a_gateway_without_volunteers_is_deleted():
    vol = tiny_spec(volunteers=VOLUNTEERS)
    have = gateway_service(owned.Owner("j", "ns", "u-1"), plan_job(parse_spec(vol), "j"), "ClusterIP")
    actions = decide(Observed(**{**vars(observed(vol)), "gateway": have}), GATEWAY)
    patches = [p for p in actions.patch if p[1] == "j-volunteers"]
    assert patches and patches[0][2]["spec"]["type"] == "LoadBalancer"
    actions = decide(Observed(**{**vars(observed(tiny_spec())), "gateway": have}), GATEWAY)
    assert ("Service", "j-volunteers") in actions.delete


@pytest.mark.parametrize(
    ("service", "address"),
    [
        ({"spec": {"type": "LoadBalancer", "ports": [{"port": 31337}]}}, None),  # no ingress yet
        (
            {
                "spec": {"type": "LoadBalancer", "ports": [{"port": 31337}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}},
            },
            "203.0.113.7:31337",
        ),
        (
            {
                "spec": {"type": "LoadBalancer", "ports": [{"port": 31337}]},
                "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}},
            },
            "lb.example:31337",
        ),
        ({"spec": {"type": "NodePort", "ports": [{"port": 31337, "nodePort": 30001}]}}, "<any node>:30001"),
        (
            {"spec": {"type": "ClusterIP", "clusterIP": "10.0.0.9", "ports": [{"port": 31337}]}},
            "10.0.0.9:31337",
        ),
        (None, None),
    ],
)
def test_gateway_address_reported_where_volunteers_dial(service, address):
    assert gateway_address(service) == address


def test_each_blocked_peer_gets_one_event_and_the_counter_never_drops():
    vol = tiny_spec(volunteers=VOLUNTEERS)
    two = JobStatus(step=2, state="Running", blocked_peers=(("p1", "bad log-probs"), ("p2", "NaN")))
    actions = decide(observed(vol, progress=two, status={"blockedPeers": 1}), SETTINGS)
    assert actions.status["blockedPeers"] == 2
    assert [e for e in actions.events if e[1] == "VolunteerBlocked"] == [
        ("Warning", "VolunteerBlocked", "peer p2 blocked: NaN")
    ]
    restarted = JobStatus(step=3, state="Running")
    actions = decide(observed(vol, progress=restarted, status={"blockedPeers": 2}), SETTINGS)
    assert actions.status["blockedPeers"] == 2 and not [
        e for e in actions.events if e[1] == "VolunteerBlocked"
    ]


def test_operator_flags_take_the_chart_gateway_values_from_the_environment(monkeypatch):
    monkeypatch.setenv("DVERL_VOLUNTEER_GATEWAY", "true")
    monkeypatch.setenv("DVERL_VOLUNTEER_SERVICE_TYPE", "NodePort")
    args = parser().parse_args(["--all-namespaces"])
    assert args.volunteer_gateway == "true" and args.volunteer_service_type == "NodePort"
    with pytest.raises(SystemExit):
        parser().parse_args(["--volunteer-service-type", "ExternalName"])


def test_the_reconcile_settings_come_from_the_flags_once():
    args = parser().parse_args(
        [
            "-A",
            "--worker-image",
            "w:2",
            "--backoff-base-seconds",
            "3",
            "--volunteer-gateway",
            "true",
            "--gang-schedulers",
            "volcano",
            "--operator-pod-labels",
            "app=op,tier=ctl",
        ]
    )
    settings = reconcile_settings(args, "ops")
    assert settings.default_image == "w:2" and settings.backoff_base_seconds == 3.0
    assert settings.volunteer_gateway and settings.gang_schedulers == frozenset({"volcano"})
    assert settings.network_policy is not None
    assert settings.network_policy.operator_namespace == "ops"
    assert dict(settings.network_policy.operator_labels) == {"app": "op", "tier": "ctl"}
    off = reconcile_settings(parser().parse_args(["-A", "--network-policy", "false"]), "ops")
    assert off.network_policy is None and not off.volunteer_gateway
    with pytest.raises(SystemExit, match="--gang-schedulers: unknown kube-batch"):
        reconcile_settings(parser().parse_args(["-A", "--gang-schedulers", "kube-batch"]), "ops")
    with pytest.raises(SystemExit, match="--operator-pod-labels"):
        reconcile_settings(parser().parse_args(["-A", "--operator-pod-labels", "nolabel"]), "ops")


def test_a_failed_pass_is_retried_soon_when_the_cluster_failed_and_at_resync_when_it_was_a_bug():
    from dverl_operator.jobs.retry import classify
    from dverl_operator.kube.errors import ApiError, ApiUnreachable

    refused = classify(ApiError(403, "POST", "api/v1/pods", "Forbidden", "no"), resync_seconds=10.0)
    assert (refused.kind, refused.from_cluster, refused.retry_after) == ("ApiError", True, 2.0)
    assert classify(ApiUnreachable("refused"), 10.0).from_cluster
    assert classify(TimeoutError(), 1.0).retry_after == 1.0  # never later than the resync
    bug = classify(KeyError("metadata"), resync_seconds=10.0)
    assert (bug.kind, bug.from_cluster, bug.retry_after) == ("KeyError", False, 10.0)
