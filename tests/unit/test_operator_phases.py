"""Each phase of the operator's pure decision, on its own: refusal, shared children, pods, outcome."""

from __future__ import annotations

import yaml

from decentralized_verl.core.status import JobStatus
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.children import guard
from dverl_operator.children.config_map import CONFIG_KEY
from dverl_operator.children.shared import sync_shared
from dverl_operator.objects import owned
from dverl_operator.objects.times import parse_time, timestamp
from dverl_operator.pods import marks as pod_marks
from dverl_operator.pods.build import CREDENTIALS_PATH
from dverl_operator.pods.decisions import (
    ANNOTATION_FAILED_AT,
    ANNOTATION_FAILURE_COUNTED,
    backoff_delay,
    decide_pods,
)
from dverl_operator.pods.security import WORKER_GID
from dverl_operator.reconcile.desired import for_job
from dverl_operator.reconcile.refusal import refuse_restart_changes, refused_changes
from dverl_operator.status import conditions as cond
from dverl_operator.status import outcome
from tests.support.cluster_world import running
from tests.support.operator_fixtures import tiny_spec

NOW = 1_800_000_000.0
BACKOFF = (10.0, 60.0)


SCOPE = guard.PolicyScope("dverl-system", {"app.kubernetes.io/name": "dverl"})


def children_of(spec_dict, name="j", gateway_type=None, policy=None):
    spec = parse_spec(spec_dict)
    plan = plan_job(spec, name)
    return spec, for_job(
        owned.Owner(name, "ns", "u-1"),
        spec,
        plan,
        "img:1",
        gateway_type=gateway_type,
        policy=policy,
        marks=pod_marks.for_job(spec, {"metadata": {"name": name}}, plan, None),
    )


def exited(pod, phase="Failed", **annotations):
    meta = {**pod["metadata"], "annotations": {**pod["metadata"].get("annotations", {}), **annotations}}
    return {**pod, "metadata": meta, "status": {"phase": phase}}


# ---------------------------------------------------------------------------------------- refusal
def test_a_model_change_is_refused_only_while_pods_run_and_not_when_suspending() -> None:
    old, _ = children_of(tiny_spec())
    applied = {
        "data": {CONFIG_KEY: yaml.safe_dump(old.model_dump(mode="json", by_alias=True, exclude_none=True))}
    }
    changed = parse_spec(
        {**tiny_spec(), "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2}}}
    )
    refusal = refuse_restart_changes(changed, applied, True, [], NOW)
    assert refusal.refused == ["spec.model"] and refusal.effective == old
    assert cond.condition(refusal.conditions, cond.SPEC_CHANGE_REFUSED)["status"] == "True"
    assert [e[1] for e in refusal.events] == [cond.SPEC_CHANGE_REFUSED]
    again = refuse_restart_changes(changed, applied, True, refusal.conditions, NOW + 5)
    assert again.events == []  # the same refusal is announced once
    assert refuse_restart_changes(changed, applied, False, refusal.conditions, NOW).refused == []
    suspending = parse_spec(
        {**changed.model_dump(mode="json", by_alias=True, exclude_none=True), "suspend": True}
    )
    cleared = refuse_restart_changes(suspending, applied, True, refusal.conditions, NOW)
    assert cleared.refused == [] and cond.condition(cleared.conditions, cond.SPEC_CHANGE_REFUSED) is None
    assert refused_changes(None, changed) == []


# ------------------------------------------------------------------------------- shared children
def test_shared_children_are_created_then_patched_only_when_they_drift() -> None:
    _, want = children_of(
        tiny_spec(volunteers={"enabled": True, "tokenSecretRef": {"name": "s"}}), gateway_type="NodePort"
    )
    create, patch, delete = sync_shared(None, None, None, want, "j")
    assert [o["kind"] for o in create] == ["ConfigMap", "Service", "Service"] and not patch and not delete
    create, patch, delete = sync_shared(want.config_map, want.service, want.gateway, want, "j")
    assert (create, patch, delete) == ([], [], [])
    stale = {**want.config_map, "metadata": {**want.config_map["metadata"], "annotations": {}}}
    retyped = {**want.gateway, "spec": {**want.gateway["spec"], "type": "LoadBalancer"}}
    create, patch, delete = sync_shared(stale, want.service, retyped, want, "j")
    assert [(k, n) for k, n, _ in patch] == [
        ("ConfigMap", want.config_map["metadata"]["name"]),
        ("Service", "j-volunteers"),
    ]
    _, plain = children_of(tiny_spec())
    assert sync_shared(want.config_map, want.service, want.gateway, plain, "j")[2] == [
        ("Service", "j-volunteers")
    ]


def test_network_policies_are_made_restored_and_removed_when_turned_off() -> None:
    volunteers = tiny_spec(volunteers={"enabled": True, "tokenSecretRef": {"name": "s"}})
    _, want = children_of(volunteers, gateway_type="NodePort", policy=SCOPE)
    create, patch, delete = sync_shared(None, None, None, want, "j")
    policies = [o for o in create if o["kind"] == "NetworkPolicy"]
    assert [o["metadata"]["name"] for o in policies] == ["j-workers", "j-volunteers"]
    observed = (want.network_policy, want.gateway_policy)
    assert sync_shared(want.config_map, want.service, want.gateway, want, "j", observed) == ([], [], [])
    edited = {**want.network_policy, "spec": {**want.network_policy["spec"], "ingress": [{}]}}
    _, patch, _ = sync_shared(want.config_map, want.service, want.gateway, want, "j", (edited, observed[1]))
    assert patch == [("NetworkPolicy", "j-workers", {"spec": want.network_policy["spec"]})]
    # no gateway, no opening for volunteers; policies off (the chart's value), both go
    _, no_gateway = children_of(volunteers, policy=SCOPE)
    assert no_gateway.network_policy is not None and no_gateway.gateway_policy is None
    _, off = children_of(volunteers, gateway_type="NodePort")
    assert off.network_policy is None and off.gateway_policy is None
    _, _, delete = sync_shared(want.config_map, want.service, want.gateway, off, "j", observed)
    assert delete == [("NetworkPolicy", "j-workers"), ("NetworkPolicy", "j-volunteers")]


def test_the_job_policy_admits_its_own_pods_everywhere_and_the_operator_on_the_coordinator_port() -> None:
    _, want = children_of(
        tiny_spec(roles={"learner": {"replicas": 2}, "rollout": {"replicas": 2}}), policy=SCOPE
    )
    spec = want.network_policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {owned.LABEL_JOB: "j"}}
    own, operator = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {owned.LABEL_JOB: "j"}}}]}
    assert operator == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dverl-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "dverl"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 50051}],
    }
    assert want.network_policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_the_job_policy_lets_the_configured_scraper_reach_the_learners_metrics_port_only() -> None:
    from decentralized_verl.planning.plan import METRICS_PORT
    from dverl_operator.flags import parser, reconcile_settings

    args = parser().parse_args(
        [
            "--metrics-scraper-namespace-labels",
            "kubernetes.io/metadata.name=monitoring",
            "--metrics-scraper-pod-labels",
            "app.kubernetes.io/name=prometheus",
        ]
    )
    scope = reconcile_settings(args, "dverl-system").network_policy
    _, want = children_of(tiny_spec(), policy=scope)
    ingress = want.network_policy["spec"]["ingress"]
    assert len(ingress) == 3
    assert ingress[2] == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
    }
    learner = want.pods["j-learner-0"]["metadata"]["annotations"]
    assert learner["prometheus.io/port"] == str(METRICS_PORT)  # the port the scraper is let in to
    # Any pod of any namespace ("" for both), or no scraper at all when neither is set.
    anyone = reconcile_settings(
        parser().parse_args(["--metrics-scraper-namespace-labels", "", "--metrics-scraper-pod-labels", ""]),
        "dverl-system",
    ).network_policy
    assert children_of(tiny_spec(), policy=anyone)[1].network_policy["spec"]["ingress"][2]["from"] == [
        {"namespaceSelector": {"matchLabels": {}}, "podSelector": {"matchLabels": {}}}
    ]
    assert len(children_of(tiny_spec(), policy=SCOPE)[1].network_policy["spec"]["ingress"]) == 2


def test_credentials_go_to_every_serving_pod_and_the_signing_key_to_learners_only() -> None:
    from decentralized_verl.security.credentials import (
        DHT_KEY_FILE,
        PUBLIC_FILES,
        SIGNING_KEY_FILE,
        TOKEN_FILE,
        issue,
        token_key,
    )
    from decentralized_verl.security.rights import TOKEN_ROLES

    spec_dict = tiny_spec(
        roles={"learner": {"replicas": 2}, "rollout": {"replicas": 2}, "reward": {"replicas": 1}},
        volunteers={"enabled": True, "tokenSecretRef": {"name": "s"}},
    )
    _, want = children_of(spec_dict)
    for pod in want.pods.values():
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert env["DVERL_TLS_DIR"] == CREDENTIALS_PATH
        assert {"name": "credentials", "mountPath": CREDENTIALS_PATH, "readOnly": True} in container[
            "volumeMounts"
        ]
        items = {i["key"]: i["path"] for i in volumes["credentials"]["secret"]["items"]}
        role = pod["metadata"]["labels"][owned.LABEL_ROLE]
        own = (
            ({token_key(role): TOKEN_FILE} if role in TOKEN_ROLES else {})
            | ({SIGNING_KEY_FILE: SIGNING_KEY_FILE} if role == "learner" else {})
            | ({DHT_KEY_FILE: DHT_KEY_FILE} if role == "dht" else {})  # the bootstrap's identity, no token
        )
        assert items == {**{k: k for k in PUBLIC_FILES}, **own}  # its own role's token, no other
        assert volumes["credentials"]["secret"]["defaultMode"] == 0o440
        assert pod["spec"]["securityContext"]["fsGroup"] == WORKER_GID  # the credentials are its alone
    secret = guard.credentials_secret(owned.Owner("j", "ns", "u-1"), issue("j", "ns"))
    assert secret["metadata"]["name"] == "j-credentials" and secret["type"] == "Opaque"
    assert sorted(secret["data"]) == sorted(
        [*PUBLIC_FILES, SIGNING_KEY_FILE, DHT_KEY_FILE, *map(token_key, TOKEN_ROLES)]
    )
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"


# ------------------------------------------------------------------------------------------- pods
def test_a_failure_is_counted_once_and_replaced_after_its_backoff() -> None:
    spec, want = children_of(tiny_spec())
    pods = {n: running(p) for n, p in want.pods.items()}
    pods["j-rollout-0"] = exited(want.pods["j-rollout-0"])
    first = decide_pods(pods, want.pods, spec, {}, NOW, BACKOFF)
    assert first.restarts == {"rollout": 1} and [p[1] for p in first.patches] == ["j-rollout-0"]
    assert "j-rollout-0" not in first.to_delete and first.requeue_after == backoff_delay(1, *BACKOFF)
    counted = exited(
        want.pods["j-rollout-0"], **{ANNOTATION_FAILURE_COUNTED: "true", ANNOTATION_FAILED_AT: f"{NOW:.3f}"}
    )
    later = decide_pods({**pods, "j-rollout-0": counted}, want.pods, spec, {"rollout": 1}, NOW + 11, BACKOFF)
    assert later.restarts == {"rollout": 1} and later.patches == [] and later.to_delete == {"j-rollout-0"}


def test_one_failed_learner_takes_the_whole_gang_down_together() -> None:
    roles = {"rollout": {"replicas": 2}, "learner": {"replicas": 2}}
    spec, want = children_of(tiny_spec(roles=roles, training={"steps": 5, "batchSize": 1}))
    pods = {n: running(p) for n, p in want.pods.items()}
    pods.pop("j-learner-1")  # deleted: the gang restarts
    decision = decide_pods(pods, want.pods, spec, {}, NOW, BACKOFF)
    assert decision.to_delete == {"j-learner-0"} and "j-learner-1" not in decision.to_create
    assert "restarting the learner gang" in decision.restart_messages
    gone = {n: p for n, p in pods.items() if n != "j-learner-0"}
    assert sorted(decide_pods(gone, want.pods, spec, {}, NOW, BACKOFF).to_create) == [
        "j-learner-0",
        "j-learner-1",
    ]


def test_past_the_backoff_limit_the_job_fails_with_the_counts() -> None:
    spec, want = children_of(tiny_spec(backoffLimit=1))
    pods = {n: exited(p) for n, p in want.pods.items() if "rollout" in n}
    decision = decide_pods(pods, want.pods, spec, {}, NOW, BACKOFF)
    assert decision.failed_job == (
        "2 worker restarts (rollout=2) exceed backoffLimit 1; last: pod j-rollout-1 (rollout) failed: Failed"
    )


def test_a_job_failed_past_its_backoff_names_the_last_pod_and_what_its_worker_said() -> None:
    spec, want = children_of(tiny_spec(backoffLimit=0))
    said = "RuntimeError: CUDA error: an illegal memory access was encountered"
    learner = exited(want.pods["j-learner-0"])
    learner["status"]["containerStatuses"] = [
        {"name": "worker", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": said}}}
    ]
    decision = decide_pods({"j-learner-0": learner}, want.pods, spec, {}, NOW, BACKOFF)
    assert decision.failed_job == (
        "1 worker restarts (learner=1) exceed backoffLimit 0; last: pod j-learner-0 (learner) failed: "
        f"container worker exited 1: {said}"
    )


# ---------------------------------------------------------------------------------------- outcome
def test_progress_is_copied_in_and_blocked_peers_never_count_down() -> None:
    progress = JobStatus(
        step=3, total_steps=9, state="Running", reward_mean=0.5, blocked_peers=(("p1", "x"),)
    )
    new, events = outcome.progress_status({"blockedPeers": 2}, {}, progress, "1.2.3.4:31337", 9)
    assert new["step"] == 3 and new["reward"] == 0.5 and new["blockedPeers"] == 2 and events == []
    assert new["volunteerGateway"] == "1.2.3.4:31337"
    new, events = outcome.progress_status({}, {}, None, None, 9)
    assert new == {"totalSteps": 9} and events == []


def test_running_needs_every_worker_ready_once() -> None:
    roles = {
        "learner": {"ready": 1, "desired": 1, "restarts": 0},
        "rollout": {"ready": 1, "desired": 2, "restarts": 0},
    }
    pending, _ = outcome.running({"roles": roles}, [], False, NOW)
    assert pending["phase"] == "Pending" and "startTime" not in pending
    roles["rollout"]["ready"] = 2
    up, _ = outcome.running({"roles": roles}, [], True, NOW)
    assert up["phase"] == "Running" and up["startTime"] and up["message"] == "spec change refused"
    roles["rollout"]["ready"] = 1  # a worker restarting later does not make the job Pending again
    later, _ = outcome.running({**up, "roles": roles}, up["conditions"], False, NOW + 1)
    assert later["phase"] == "Running"


def test_suspending_clears_the_start_time_and_announces_once() -> None:
    status, events = outcome.suspended({"phase": "Running", "startTime": "t"}, [], {"learner": 1}, {}, NOW)
    assert status["phase"] == "Suspended" and "startTime" not in status and len(events) == 1
    assert outcome.suspended(status, status["conditions"], {"learner": 1}, {}, NOW)[1] == []


# ------------------------------------------------------------------------------ failure policies
def test_each_failure_policy_does_what_it_says() -> None:
    spec_dict = tiny_spec(
        roles={"rollout": {"replicas": 2, "failurePolicy": "restartRole"}, "learner": {"replicas": 1}}
    )
    spec, want = children_of(spec_dict)
    counted = {ANNOTATION_FAILURE_COUNTED: "true", ANNOTATION_FAILED_AT: f"{NOW - 100:.3f}"}
    pods = {n: running(p) for n, p in want.pods.items()}
    pods["j-rollout-0"] = exited(want.pods["j-rollout-0"], **counted)
    role = decide_pods(pods, want.pods, spec, {"rollout": 1}, NOW, BACKOFF)
    assert role.to_delete == {"j-rollout-0", "j-rollout-1"}  # the whole role, not just the failed pod
    assert any("every rollout worker" in m for m in role.restart_messages)
    assert [e[1] for e in role.events] == ["Restarting"]

    spec, want = children_of(
        tiny_spec(roles={"rollout": {"replicas": 2, "failurePolicy": "failJob"}, "learner": {}})
    )
    fails = decide_pods(
        {**pods, "j-rollout-0": exited(want.pods["j-rollout-0"], **counted)},
        want.pods,
        spec,
        {"rollout": 1},
        NOW,
        BACKOFF,
    )
    assert fails.failed_job == "pod j-rollout-0 (rollout) failed and roles.rollout.failurePolicy is failJob"


def test_the_learner_cannot_restart_rank_by_rank() -> None:
    import pytest

    from decentralized_verl.errors import ManifestError

    with pytest.raises(ManifestError, match=r"roles\.learner\.failurePolicy"):
        parse_spec(tiny_spec(roles={"rollout": {"replicas": 2}, "learner": {"failurePolicy": "restartPod"}}))
    assert parse_spec(tiny_spec()).roles.failure_policy("learner") == "restartRole"
    assert parse_spec(tiny_spec()).roles.failure_policy("reward") == "restartPod"


# ------------------------------------------------------------------------------------------ stalls
def test_a_learner_whose_step_stops_advancing_is_restarted_once_its_allowance_is_spent() -> None:
    from dverl_operator.pods.decisions import PodDecision, restart_stalled, stalled_learner

    _, want = children_of(tiny_spec())
    learner = running(want.pods["j-learner-0"])
    learner["status"]["startTime"] = timestamp(NOW - 2000)
    pods = {"j-learner-0": learner}
    fresh = {"lastProgressTime": timestamp(NOW - 2000)}
    assert stalled_learner(fresh, pods, ["j-learner-0"], 10.0, NOW - 2000 + 800) is None  # still loading
    assert "has not advanced" in stalled_learner(fresh, pods, ["j-learner-0"], 10.0, NOW)
    stepping = {"lastProgressTime": timestamp(NOW - 50), "stepSeconds": 3.0}
    assert stalled_learner(stepping, pods, ["j-learner-0"], 10.0, NOW) is None  # 50 s < max(60, 30)
    late = {"lastProgressTime": timestamp(NOW - 400), "stepSeconds": 30.0}
    why = stalled_learner(late, pods, ["j-learner-0"], 10.0, NOW)
    assert why is not None and "allowed 300s" in why
    deleting = {**learner, "metadata": {**learner["metadata"], "deletionTimestamp": "x"}}
    assert stalled_learner(late, {"j-learner-0": deleting}, ["j-learner-0"], 10.0, NOW) is None
    decision = PodDecision()
    restart_stalled(decision, pods, ["j-learner-0"], why)
    assert decision.to_delete == {"j-learner-0"} and decision.restarts == {"learner": 1}
    assert decision.events[0][1] == "LearnerStalled" and decision.restart_reason == "LearnerStalled"


def test_a_learner_waiting_for_a_replaced_or_starting_pod_is_not_stalled() -> None:
    """The allowance follows the pods the learner works with: while a rollout pod is being replaced (the
    old one deleting, the new one not made, pending or not ready) the learner is waiting, however long;
    once the new pod is ready the clock starts again from then, and only a step that then outlasts its
    allowance is a stall."""
    from dverl_operator.pods.decisions import stalled_learner

    _, want = children_of(tiny_spec())
    learners = ["j-learner-0"]
    others = sorted(want.pods)
    learner = running(want.pods["j-learner-0"])
    learner["status"]["startTime"] = timestamp(NOW - 2000)

    def ready_at(at: float) -> dict:
        pod = running(want.pods["j-rollout-0"])
        pod["status"]["conditions"] = [
            {"type": "Ready", "status": "True", "lastTransitionTime": timestamp(at)}
        ]
        return pod

    def job(rollout: dict | None) -> dict:
        steady = ready_at(NOW - 1900)
        steady["metadata"] = {**steady["metadata"], "name": "j-rollout-1"}
        return {
            "j-learner-0": learner,
            "j-rollout-1": steady,
            **({"j-rollout-0": rollout} if rollout is not None else {}),
        }

    late = {"lastProgressTime": timestamp(NOW - 400), "stepSeconds": 30.0}  # 400 s > its 300 s
    old_rollout = ready_at(NOW - 1900)
    assert stalled_learner(late, job(old_rollout), learners, 10.0, NOW, others)
    deleting = {**old_rollout, "metadata": {**old_rollout["metadata"], "deletionTimestamp": "x"}}
    pending = {**want.pods["j-rollout-0"], "status": {"phase": "Pending"}}
    starting = running(want.pods["j-rollout-0"])
    starting["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    for rollout in (deleting, None, pending, starting):
        assert stalled_learner(late, job(rollout), learners, 10.0, NOW, others) is None, rollout
    replaced = job(ready_at(NOW - 100))
    assert stalled_learner(late, replaced, learners, 10.0, NOW, others) is None  # 100 s since it came
    why = stalled_learner(late, replaced, learners, 10.0, NOW + 201, others)
    assert why is not None and "for 301s (allowed 300s)" in why
    # Without the pods it works with, the old rule: the learner's own start and its progress.
    assert stalled_learner(late, {"j-learner-0": learner}, learners, 10.0, NOW) is not None


def test_progress_time_moves_only_when_the_step_does() -> None:
    progress = JobStatus(
        step=3, total_steps=9, state="Running", phase_seconds=(("rollout", 1.0), ("update", 2.0))
    )
    new, _ = outcome.progress_status({"step": 2}, {}, progress, None, 9, NOW)
    assert new["lastProgressTime"] == timestamp(NOW) and new["stepSeconds"] == 3.0
    same, _ = outcome.progress_status(new, dict(new), progress, None, 9, NOW + 30)
    assert same["lastProgressTime"] == timestamp(NOW)
    assert parse_time(timestamp(NOW)) == NOW and parse_time(None) is None
