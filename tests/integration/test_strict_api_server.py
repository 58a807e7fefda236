"""The test world's API server says no where a real one does: each rule is made to refuse over HTTP, and
the refusal is checked as a client (the tests' own, or the operator's lightkube client with its token)
sees it. The pure rules are in tests/unit/test_api_server_rules.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dverl_operator.kube.client import Cluster
from dverl_operator.kube.connection import client_config
from dverl_operator.kube.errors import ApiError
from tests.support.operator_fixtures import JOBS, Emulator, Operator, job_body, tiny_spec, wait_for

pytestmark = [pytest.mark.timeout(180)]
JOB = f"{JOBS}/namespaces/default/rlhfjobs"


def pod(name: str, gpus: int = 0) -> dict:
    limits = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    container = {"name": "c", "image": "i", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container]},
    }


async def test_a_write_from_a_stale_resource_version_is_a_409_conflict(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        created = await emu.create_job("j", tiny_spec())
        first = created["metadata"]["resourceVersion"]
        assert created["metadata"]["generation"] == 1 and created["metadata"]["uid"]
        await emu.patch_job_spec("j", {"training": {"steps": 11}})
        now = (await emu.job("j"))["metadata"]
        assert int(now["resourceVersion"]) > int(first) and now["generation"] == 2
        stale = {"metadata": {"resourceVersion": first}, "spec": {"training": {"steps": 12}}}
        code, body = await emu.request("PATCH", f"{JOB}/j", stale, "application/merge-patch+json")
        assert (code, body["reason"]) == (409, "Conflict")
        assert body["message"] == (
            'Operation cannot be fulfilled on rlhfjobs.dverl.io "j": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        assert (await emu.job("j"))["spec"]["training"]["steps"] == 11  # nothing applied
        fresh = {"metadata": {"resourceVersion": now["resourceVersion"]}, "spec": {"training": {"steps": 12}}}
        code, body = await emu.request("PATCH", f"{JOB}/j", fresh, "application/merge-patch+json")
        assert code == 200 and body["spec"]["training"]["steps"] == 12


async def test_status_and_spec_are_written_only_through_their_own_endpoints(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        await emu.create_job("j", tiny_spec())
        both = {"spec": {"training": {"steps": 12}}, "status": {"phase": "Running"}}
        await emu.call("PATCH", f"{JOB}/j", both, "application/merge-patch+json")
        job = await emu.job("j")
        assert (
            "status" not in job
            and job["spec"]["training"]["steps"] == 12
            and job["metadata"]["generation"] == 2
        )
        await emu.call("PATCH", f"{JOB}/j/status", both, "application/merge-patch+json")
        job = await emu.job("j")
        assert job["status"] == {"phase": "Running"} and job["metadata"]["generation"] == 2
        code, body = await emu.request(
            "PATCH", f"{JOB}/j/status", {"status": {"phase": "Dancing"}}, "application/merge-patch+json"
        )
        assert code == 422 and 'status.phase: Unsupported value: "Dancing"' in body["message"]


async def test_a_job_the_schema_or_a_cel_rule_refuses_is_a_422_naming_the_field(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        code, body = await emu.request("POST", JOB, job_body("bad", tiny_spec(training={"steps": -3})))
        assert (code, body["reason"]) == (422, "Invalid")
        assert body["message"].startswith(
            'RLHFJob.dverl.io "bad" is invalid: spec.training.steps: Invalid value: -3'
        )
        both = tiny_spec(training={"steps": 10, "epochs": 2, "batchSize": 2})
        code, body = await emu.request("POST", JOB, job_body("bad", both))
        assert code == 422 and 'spec.training: Invalid value: "object": ' in body["message"]  # a CEL rule
        assert await emu.job("bad") is None
        await emu.create_job("good", tiny_spec())
        code, body = await emu.request(
            "PATCH",
            f"{JOB}/good",
            {"spec": {"roles": {"rollout": {"replicas": -1}}}},
            "application/merge-patch+json",
        )
        assert code == 422 and "spec.roles.rollout.replicas" in body["message"]


async def test_a_watch_resumed_from_a_compacted_version_gets_410_gone(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        listed = await emu.call("GET", JOB)
        since = listed["metadata"]["resourceVersion"]
        await emu.create_job("a", tiny_spec())
        events = await _watch(emu, f"{JOB}?watch=true&resourceVersion={since}&timeoutSeconds=1")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]
        compacted = emu.kmock.compact()
        await emu.create_job("b", tiny_spec())
        events = await _watch(emu, f"{JOB}?watch=true&resourceVersion={since}&timeoutSeconds=1")
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        gone = events[0]["object"]
        assert (gone["code"], gone["reason"]) == (410, "Expired")
        assert gone["message"] == f"too old resource version: {since} ({compacted + 1})"
        events = await _watch(emu, f"{JOB}?watch=true&resourceVersion={compacted}&timeoutSeconds=1")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


async def _watch(emu: Emulator, path: str) -> list[dict]:
    """Every event of a watch until the server ends it."""
    assert emu.session is not None
    async with emu.session.get(f"{emu.url}/{path}") as resp:
        text = await asyncio.wait_for(resp.text(), 30)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_the_operator_recovers_when_its_watches_expire_and_history_is_compacted(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        op = Operator(emu, "op-a").start()
        try:
            await emu.create_job("before", tiny_spec())
            await wait_for(lambda: emu.pods("before"), timeout=60, what="pods of the first job")
            emu.kmock.compact()
            emu.kmock.expire_watches()  # every watch resumes from a version the server no longer has
            await wait_for(
                lambda: [r for r in emu.kmock.refusals if r["code"] == 410],
                timeout=60,
                what="a resumed watch answered 410 Gone",
            )
            await emu.create_job("after", tiny_spec())
            await wait_for(lambda: emu.pods("after"), timeout=60, what="pods of a job created after the 410")
        finally:
            assert await asyncio.to_thread(op.stop) == 0, op.log()[-3000:]


async def test_pod_security_and_quota_refuse_pod_creates_in_the_api_servers_words(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        await emu.namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
        code, body = await emu.request("POST", "api/v1/namespaces/locked/pods", pod("p"))
        assert (code, body["reason"]) == (403, "Forbidden")
        assert body["message"].startswith('pods "p" is forbidden: violates PodSecurity "restricted:latest": ')
        await emu.quota("gpus", {"requests.nvidia.com/gpu": "2"})
        assert (await emu.request("POST", "api/v1/namespaces/default/pods", pod("a", gpus=2)))[0] == 201
        code, body = await emu.request("POST", "api/v1/namespaces/default/pods", pod("b", gpus=1))
        assert code == 403 and body["message"] == (
            'pods "b" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
            "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
        )
        assert await emu.get("pods", "b") is None


async def test_the_operators_requests_are_authorized_by_the_charts_rendered_rbac(tmp_path: Path) -> None:
    # The chart namespaced to `team`: the operator's ServiceAccount may create pods there and nowhere else.
    async with (
        Emulator(tmp_path, chart_values=["watchNamespaces={team}"]) as emu,
        Cluster(client_config(str(emu.kubeconfig))) as cluster,
    ):
        assert await cluster.create("Pod", "team", pod("p")) is True
        with pytest.raises(ApiError) as caught:
            await cluster.create("Pod", "default", pod("p"))
        assert (caught.value.status, caught.value.reason) == (403, "Forbidden")
        assert caught.value.message == (
            f'pods "p" is forbidden: User "{emu.operator_user}" cannot create resource "pods" '
            'in API group "" in the namespace "default"'
        )
        with pytest.raises(ApiError) as caught:  # a pod's spec is fixed once it exists
            await cluster.patch("Pod", "team", "p", {"spec": {"serviceAccountName": "admin"}})
        assert (caught.value.status, caught.value.reason) == (422, "Invalid")
        assert "pod updates may not change fields other than" in caught.value.message
        with pytest.raises(ApiError) as caught:  # the identity Role reads one Secret by name only
            await cluster.get("Secret", "default", "someone-elses")
        assert caught.value.status == 403


async def test_a_chart_without_rbac_leaves_the_operator_refused(tmp_path: Path) -> None:
    async with Emulator(tmp_path, chart_values=["rbac.create=false"]) as emu:
        op = Operator(emu, "op-a").start()
        try:
            await wait_for(
                lambda: [
                    r for r in emu.kmock.refusals if r["code"] == 403 and emu.operator_user in r["message"]
                ],
                timeout=60,
                what="the operator refused for want of RBAC",
            )
            await emu.create_job("j", tiny_spec())
            await asyncio.sleep(3)
            assert await emu.pods("j") == {}
        finally:
            await asyncio.to_thread(op.stop)


async def test_the_operators_pods_pass_restricted_admission_and_meet_the_quota(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        await emu.namespace("secure", {"pod-security.kubernetes.io/enforce": "restricted"})
        await emu.quota("small", {"pods": "1"})
        op = Operator(emu, "op-a").start()
        try:
            await emu.create_job("strict", tiny_spec(), namespace="secure")
            await wait_for(lambda: _count(emu, "strict", "secure", 3), timeout=60, what="3 admitted pods")
            await emu.create_job("crowded", tiny_spec())
            said = await wait_for(
                lambda: [r["message"] for r in emu.kmock.refusals if "exceeded quota: small" in r["message"]],
                timeout=60,
                what="the operator's second pod refused by the quota",
            )
            assert said[0].endswith("requested: pods=1, used: pods=1, limited: pods=1")
            assert len(await emu.pods("crowded")) == 1
            assert not [r for r in emu.kmock.refusals if "PodSecurity" in r["message"]]
        finally:
            await asyncio.to_thread(op.stop)


async def _count(emu: Emulator, job: str, namespace: str, count: int) -> bool:
    return len(await emu.pods(job, namespace)) == count


def needs_baseline() -> dict:
    """A job whose rollout pods need baseline: an init container running as root with a default
    capability, declared as such."""
    spec = tiny_spec()
    setup = {
        "name": "setup",
        "image": "i",
        "securityContext": {"runAsUser": 0, "capabilities": {"add": ["CHOWN"]}},
    }
    spec["roles"]["rollout"]["podTemplate"] = {"spec": {"initContainers": [setup]}}
    spec["podSecurity"] = "baseline"
    return spec


async def test_a_job_declaring_more_than_its_namespace_enforces_is_refused_before_any_pod(
    tmp_path: Path,
) -> None:
    """The operator reads the namespace's enforce label (a right the chart grants): in a restricted
    namespace a baseline job fails naming the field, its level and the label, and no pod create reaches
    admission; in a baseline namespace the same job's pods are made and admitted."""
    async with Emulator(tmp_path) as emu:
        label = "pod-security.kubernetes.io/enforce"
        await emu.namespace("locked", {label: "restricted"})
        await emu.namespace("open", {label: "baseline"})
        op = Operator(emu, "op-a").start()
        try:
            await emu.create_job("needy", needs_baseline(), namespace="locked")
            await emu.create_job("needy", needs_baseline(), namespace="open")

            async def failed() -> dict | None:
                status = ((await emu.job("needy", "locked")) or {}).get("status") or {}
                return status if status.get("phase") == "Failed" else None

            status = await wait_for(failed, timeout=60, what="the job in the restricted namespace refused")
            said = (
                "spec.podSecurity: 'baseline' is more than namespace 'locked' admits: its label "
                f"{label}=restricted enforces restricted"
            )
            assert status["message"] == said
            assert [c["reason"] for c in status["conditions"] if c["type"] == "ValidationFailed"] == [
                "InvalidSpec"
            ]
            assert said in [
                e["message"] for e in await emu.events("locked") if e["reason"] == "ValidationFailed"
            ]
            await wait_for(
                lambda: _count(emu, "needy", "open", 3), timeout=60, what="3 admitted baseline pods"
            )
            assert await emu.pods("needy", "locked") == {}
            assert not [
                r for r in emu.kmock.refusals if "PodSecurity" in r["message"] or "namespaces" in r["message"]
            ]
        finally:
            await asyncio.to_thread(op.stop)
