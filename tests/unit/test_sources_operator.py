"""The pods the operator builds for a job with sources and pod templates: each source mounted as its kind
asks in the pods of its roles, URIs fetched by an init container, templates merged without losing what
the operator depends on, and a change of either replacing the pods."""

from __future__ import annotations

from typing import Any

from decentralized_verl.planning.plan import plan_job
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.objects import owned
from dverl_operator.pods.sources import FETCH_MODULE
from dverl_operator.reconcile.desired import for_job
from tests.support.operator_fixtures import tiny_spec

DIGEST = "cd" * 32
OWNER = owned.Owner("j", "ns", "uid-1")
SOURCES = [
    {"name": "toy", "mountPath": "/data", "pvc": {"claimName": "rl-data", "subPath": "toy"}},
    {"name": "model", "mountPath": "/models", "roles": ["rollout", "learner"],
     "uri": {"url": "hf://org/tiny/m.tar.gz", "sha256": DIGEST}},
    {"name": "small", "mountPath": "/small", "roles": ["reward"], "configMap": {"name": "small-data"}},
    {"name": "examples", "image": {"path": "/opt/dverl/examples"}},
]  # fmt: skip


def pods(**overrides: Any) -> dict[str, dict[str, Any]]:
    spec = parse_spec(tiny_spec(**overrides))
    return for_job(OWNER, spec, plan_job(spec, "j"), "img:1").pods


def with_sources(**roles: Any) -> dict[str, Any]:
    return {
        "sources": SOURCES,
        "model": {"path": "/models/m"},
        "data": {"train": "/data/train.jsonl"},
        "roles": {"rollout": {"replicas": 1}, "learner": {"replicas": 1}, "reward": {"replicas": 1}, **roles},
    }


def mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}


def volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def test_each_kind_is_mounted_in_the_pods_of_its_roles() -> None:
    built = pods(**with_sources())
    learner, rollout, reward = built["j-learner-0"], built["j-rollout-0"], built["j-reward-0"]
    for pod in (learner, rollout, reward):  # no roles named: every role
        assert mounts(pod)["/data"] == {
            "name": "src-toy",
            "mountPath": "/data",
            "readOnly": True,
            "subPath": "toy",
        }
        assert volumes(pod)["src-toy"]["persistentVolumeClaim"] == {"claimName": "rl-data", "readOnly": True}
        assert "src-examples" not in volumes(pod)  # already in the image
    assert "/models" not in mounts(reward) and "src-model" not in volumes(reward)
    assert mounts(reward)["/small"]["readOnly"] is True
    assert volumes(reward)["src-small"]["configMap"] == {"name": "small-data"}
    assert "/small" not in mounts(learner)
    for pod in (learner, rollout):
        assert mounts(pod)["/models"] == {"name": "src-model", "mountPath": "/models", "readOnly": True}
        assert volumes(pod)["src-model"] == {"name": "src-model", "emptyDir": {}}
        [fetcher] = pod["spec"]["initContainers"]
        assert fetcher["name"] == "fetch-model" and fetcher["image"] == "img:1"
        url = "hf://org/tiny/m.tar.gz"
        assert fetcher["command"] == [
            "python", "-m", FETCH_MODULE, "--url", url, "--dest", "/models", "--sha256", DIGEST,
        ]  # fmt: skip
        assert fetcher["volumeMounts"] == [{"name": "src-model", "mountPath": "/models"}]  # writable for it
        assert fetcher["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert fetcher["securityContext"]["allowPrivilegeEscalation"] is False
    assert "initContainers" not in reward["spec"]


def test_a_colocated_role_reads_its_source_in_the_learner() -> None:
    spec = with_sources(reward={"replicas": 0})
    built = pods(**spec)
    assert "j-reward-0" not in built
    assert mounts(built["j-learner-0"])["/small"]["name"] == "src-small"


def test_pod_template_is_merged_and_the_operator_keeps_its_own() -> None:
    template = {
        "metadata": {"labels": {"team": "rl", owned.LABEL_ROLE: "mine"}, "annotations": {"note": "x"}},
        "spec": {
            "env": [{"name": "HF_ENDPOINT", "value": "http://mirror"}, {"name": "EXTRA", "value": "1"}],
            "envFrom": [{"secretRef": {"name": "tokens"}}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "nodeSelector": {"zone": "a", "pool": "mine"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
            },
            "initContainers": [{"name": "warm", "image": "busybox", "command": ["true"]}],
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "reader",
        },
    }
    pools = [{"name": "p", "replicas": 1, "nodeSelector": {"pool": "gpu"}}]
    built = pods(**with_sources(learner={"replicas": 1, "podTemplate": template, "nodePools": pools}))
    learner, rollout = built["j-learner-0"], built["j-rollout-0"]
    meta, spec = learner["metadata"], learner["spec"]
    assert meta["labels"]["team"] == "rl" and meta["labels"][owned.LABEL_ROLE] == "learner"
    assert meta["annotations"]["note"] == "x" and owned.ANNOTATION_TEMPLATE_HASH in meta["annotations"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EXTRA"] == "1" and env["DVERL_ROLE"] == "learner"
    assert container["envFrom"] == [{"secretRef": {"name": "tokens"}}]
    assert mounts(learner)["/cache"]["name"] == "cache" and "cache" in volumes(learner)
    assert spec["nodeSelector"] == {"zone": "a", "pool": "gpu"}  # the pool's own selector wins
    assert {"key": "spot", "operator": "Exists"} in spec["tolerations"]
    assert "nodeAffinity" in spec["affinity"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-model", "warm"]  # sources first
    assert spec["initContainers"][1]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == "reader" and "automountServiceAccountToken" not in spec
    # the fetcher sees the mirror it is told about
    assert {"name": "HF_ENDPOINT", "value": "http://mirror"} in spec["initContainers"][0]["env"]
    # another role's pods are untouched
    assert (
        "team" not in rollout["metadata"]["labels"]
        and rollout["spec"]["automountServiceAccountToken"] is False
    )


def test_changing_sources_or_template_replaces_pods_and_plain_jobs_keep_their_hash() -> None:
    def hashes(**overrides: Any) -> dict[str, str]:
        return {
            n: p["metadata"]["annotations"][owned.ANNOTATION_TEMPLATE_HASH]
            for n, p in pods(**overrides).items()
        }

    base = hashes(**with_sources())
    moved = [dict(SOURCES[0], pvc={"claimName": "rl-data", "subPath": "toy-v2"}), *SOURCES[1:]]
    assert hashes(**{**with_sources(), "sources": moved}) != base
    templated = hashes(
        **with_sources(rollout={"replicas": 1, "podTemplate": {"metadata": {"labels": {"a": "b"}}}})
    )
    assert templated["j-rollout-0"] != base["j-rollout-0"] and templated["j-learner-0"] == base["j-learner-0"]
    assert hashes() == hashes()  # deterministic


def test_a_failed_fetch_is_named_in_the_jobs_event() -> None:
    from dverl_operator.pods.decisions import decide_pods
    from dverl_operator.pods.failure import failure_reason

    spec = parse_spec(tiny_spec(**with_sources()))
    want = for_job(OWNER, spec, plan_job(spec, "j"), "img:1").pods
    message = "hf://org/tiny/m.tar.gz: SHA-256 is 00ff, expected cdcd: refusing the download"
    failed = {
        **want["j-rollout-0"],
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "fetch-model", "state": {"terminated": {"exitCode": 1, "message": message}}}
            ],
            "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }
    assert failure_reason(failed) == f"container fetch-model exited 1: {message}"
    running = {n: {**p, "status": {"phase": "Running"}} for n, p in want.items()}
    decision = decide_pods({**running, "j-rollout-0": failed}, want, spec, {}, 1000.0, (10.0, 300.0))
    assert (
        "Warning",
        "WorkerFailed",
        f"pod j-rollout-0 (rollout) failed: container fetch-model exited 1: {message}",
    ) in (decision.events)
    assert failure_reason({"status": {"phase": "Failed", "reason": "Evicted"}}) == "Evicted"
    assert failure_reason({"status": {"phase": "Failed"}}) == "Failed"


def test_only_a_manifest_that_says_so_gets_an_unchecked_fetch() -> None:
    unchecked = {
        "name": "model",
        "mountPath": "/models",
        "uri": {"url": "https://h/m.bin", "insecureSkipDigest": True},
    }
    spec = {**with_sources(), "sources": [unchecked]}
    [fetcher] = pods(**spec)["j-learner-0"]["spec"]["initContainers"]
    assert fetcher["command"][-1] == "--insecure-skip-digest" and "--sha256" not in fetcher["command"]
