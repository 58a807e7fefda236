"""Shared pieces for the operator tests and the scale benchmark: a Kubernetes API emulator (kmock) with
the RLHFJob resource, made as strict as an API server (tests/support/api_server: schema and CEL
validation, resourceVersions and 409s, 410 Gone watches, Pod Security and quota admission, the operator
authorized against the chart's rendered RBAC), a garbage collector for ownerReferences, and the real
operator as a subprocess.

The emulator runs no kubelet and no garbage collector: the fixture collects garbage the way a cluster
would (cascade deletion), and tests play the kubelet by patching pod status (or run the node harness).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import yaml

from tests.support.api_server.rbac import chart_authorizer
from tests.support.api_server.strict import StrictEmulator
from tests.support.node_harness.image import TEST_WORKER_IMAGE
from tests.support.paths import ROOT
from tests.support.processes import free_port

REPO = ROOT
JOBS = "apis/dverl.io/v1alpha1"
WORKER_IMAGE = TEST_WORKER_IMAGE
RELEASE_NAME = "dverl-operator"
"""The chart's objects are named so the operator's defaults (its identity Secret, its Lease) are the names
the chart's RBAC grants."""
OPERATOR_TOKEN = "test-token"
"""The operator's bearer token in the kubeconfig: the emulator takes it for the chart's ServiceAccount."""
CRD = yaml.safe_load((ROOT / "crds" / "rlhfjob.yaml").read_text())


def crd_schema() -> dict[str, Any]:
    """The RLHFJob's structural schema as the CRD the chart installs states it."""
    return CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """A small valid spec: one learner, two rollout workers."""
    spec: dict[str, Any] = {
        "model": {"tiny": {}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "data/train.jsonl"},
        "roles": {"rollout": {"replicas": 2}, "learner": {"replicas": 1}},
        "training": {"steps": 10, "batchSize": 2},
    }
    for key, value in overrides.items():
        spec[key] = value
    return spec


def job_body(
    name: str, spec: dict[str, Any], namespace: str = "default", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """An RLHFJob as a user writes it."""
    return {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
    }


class RecentRequests(list):
    """kmock's record of requests, cut to the newest on every append: kmock scans the whole record on each
    new request (once per registered reaction), so an unbounded one makes every request slower than the
    last. The newest entries stay, so a request still being routed (at most the operator's concurrent
    calls, well under the bound) is always found."""

    KEEP = 128

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        """Every request ever made, by `METHOD /path` (what tests that count API reads look at)."""

    def append(self, item: Any) -> None:
        self.counts[f"{item.method.name} {item.url.path}"] += 1
        super().append(item)
        if len(self) > self.KEEP:
            del self[: len(self) - self.KEEP]


class Emulator:
    """The strict emulator served on 127.0.0.1 plus a client and cluster behaviours.

    The operator (its kubeconfig's token) acts as the chart's ServiceAccount, rendered into `default` with
    `chart_values` (helm `--set`s); `rbac=False` leaves it unchecked. The tests' own client is an admin.
    The operator these fixtures start watches every namespace (`--all-namespaces`), so the chart is
    rendered with its cluster-wide opt-in unless the test chooses the namespaces itself."""

    def __init__(self, tmp: Path, chart_values: Sequence[str] = (), rbac: bool = True) -> None:
        self.tmp = tmp
        scoped = any(v.startswith(("watchNamespaces", "clusterWide")) for v in chart_values)
        cluster_wide = [] if scoped else ["clusterWide=true"]
        values = [f"fullnameOverride={RELEASE_NAME}", *cluster_wide, *chart_values]
        authorizer, user = chart_authorizer("default", values) if rbac else (None, "operator")
        self.operator_user = user
        self.kmock = StrictEmulator(
            schemas={"rlhfjobs.dverl.io": crd_schema()},
            authorizer=authorizer,
            tokens={OPERATOR_TOKEN: user},
        )
        self.server = kmock.Server(self.kmock)
        self.session: aiohttp.ClientSession | None = None
        self._gc: asyncio.Task[None] | None = None
        self.kubeconfig = tmp / "kubeconfig.yaml"

    async def __aenter__(self) -> Emulator:
        await self.kmock.__aenter__()
        await self.server.__aenter__()
        self.kmock.resources.load_bundled()
        self.kmock.resources["dverl.io/v1alpha1/rlhfjobs"] = kmock.ResourceInfo(
            kind="RLHFJob",
            singular="rlhfjob",
            namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            shortnames={"rlhf"},
            categories={"all", "dverl"},
            subresources={"status"},
        )
        self.session = aiohttp.ClientSession()
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": str(self.url)}}],
                    "users": [{"name": "emu", "user": {"token": OPERATOR_TOKEN}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                    "current-context": "emu",
                }
            )
        )
        self.kmock._requests = RecentRequests()
        self._gc = asyncio.create_task(self._collect_garbage())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._gc is not None:
            self._gc.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc
        if self.session is not None:
            await self.session.close()
        await self.server.__aexit__(None, None, None)
        await self.kmock.__aexit__(None, None, None)

    @property
    def url(self) -> Any:
        return self.server.url

    # ------------------------------------------------------------------------------- raw API
    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        assert self.session is not None
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.session.request(method, f"{self.url}/{path}", json=body, headers=headers) as resp:
            payload = await resp.json(content_type=None)
            if resp.status == 404:
                return None
            assert resp.status < 400, (method, path, resp.status, payload)
            return payload

    def register_pod_groups(self) -> None:
        """Serve the two PodGroup APIs gang schedulers install (scheduler-plugins, Volcano) as their CRDs
        would."""
        for group, version in (("scheduling.x-k8s.io", "v1alpha1"), ("scheduling.volcano.sh", "v1beta1")):
            self.kmock.resources[f"{group}/{version}/podgroups"] = kmock.ResourceInfo(
                kind="PodGroup",
                singular="podgroup",
                namespaced=True,
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                subresources={"status"},
            )

    async def create_job(
        self,
        name: str,
        spec: dict[str, Any],
        namespace: str = "default",
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create an RLHFJob as kubectl would (the API server assigns uid, resourceVersion, generation)."""
        body = job_body(name, spec, namespace, labels)
        return await self.call("POST", f"{JOBS}/namespaces/{namespace}/rlhfjobs", body)

    async def plant_job(self, name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        """An RLHFJob stored as it was before the CRD's schema refused it (an API server keeps such
        objects): what the operator's own validation is for."""
        body = job_body(name, spec, namespace)
        return await self.kmock.store(kmock.resource("dverl.io", "v1alpha1", "rlhfjobs"), body, checked=False)

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """(HTTP status, JSON body) of one request as the tests' admin, refusals included."""
        assert self.session is not None
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.session.request(method, f"{self.url}/{path}", json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Create a Namespace (labelled, e.g. to enforce a Pod Security level)."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        await self.kmock.store(kmock.resource("", "v1", "namespaces"), body)

    async def quota(self, name: str, hard: dict[str, str], namespace: str = "default") -> None:
        """A ResourceQuota the admission stage counts pod creates against."""
        body = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": hard},
        }
        await self.call("POST", f"api/v1/namespaces/{namespace}/resourcequotas", body)

    async def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return await self.call("GET", f"{JOBS}/namespaces/{namespace}/rlhfjobs/{name}")

    async def patch_job_spec(self, name: str, spec_patch: dict[str, Any], namespace: str = "default") -> None:
        """A user edit: merge-patch the spec (the API server moves metadata.generation)."""
        await self.call(
            "PATCH",
            f"{JOBS}/namespaces/{namespace}/rlhfjobs/{name}",
            {"spec": spec_patch},
            "application/merge-patch+json",
        )

    async def delete_job(self, name: str, namespace: str = "default") -> None:
        await self.call("DELETE", f"{JOBS}/namespaces/{namespace}/rlhfjobs/{name}")

    async def pods(self, job: str | None = None, namespace: str = "default") -> dict[str, dict[str, Any]]:
        items = (await self.call("GET", f"api/v1/namespaces/{namespace}/pods"))["items"]
        return {
            p["metadata"]["name"]: p
            for p in items
            if job is None or (p["metadata"].get("labels") or {}).get("dverl.io/job") == job
        }

    async def get(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return await self.call("GET", f"api/v1/namespaces/{namespace}/{plural}/{name}")

    async def events(self, namespace: str = "default") -> list[dict[str, Any]]:
        return (await self.call("GET", f"api/v1/namespaces/{namespace}/events"))["items"]

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        await self.call("DELETE", f"api/v1/namespaces/{namespace}/pods/{name}")

    async def set_pod_phase(
        self, name: str, phase: str, namespace: str = "default", reason: str = ""
    ) -> None:
        """Play the kubelet: Running+Ready, Failed (Error), or Succeeded."""
        ready = "True" if phase == "Running" else "False"
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": ready}],
        }
        if reason:
            status["reason"] = reason
        await self.call(
            "PATCH",
            f"api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": status},
            "application/merge-patch+json",
        )

    async def run_all_pods(self, job: str, namespace: str = "default") -> None:
        for name, pod in (await self.pods(job, namespace)).items():
            if (pod.get("status") or {}).get("phase") != "Running":
                await self.set_pod_phase(name, "Running", namespace)

    def history(self, plural: str, name: str, namespace: str = "default", group: str = "") -> list[Any]:
        """Every stored version of an object (None marks a deletion), straight from the emulator."""
        version = "v1alpha1" if group == "dverl.io" else "v1"
        key = (kmock.resource(group, version, plural), namespace, name)
        return list(self.kmock.objects[key].history) if key in self.kmock.objects else []

    # ------------------------------------------------------------------------ garbage collection
    async def _collect_garbage(self) -> None:
        """Delete objects whose controlling owner no longer exists (the cluster's GC controller)."""
        while True:
            await asyncio.sleep(0.2)
            live_uids = {
                (obj.get("metadata") or {}).get("uid")
                for (resource, _, _), obj in list(self.kmock.objects.items())
                if not obj.deleted and resource.plural == "rlhfjobs"
            }
            doomed = []
            for (resource, namespace, name), obj in list(self.kmock.objects.items()):
                if obj.deleted or resource.plural == "rlhfjobs":
                    continue
                owners = (obj.get("metadata") or {}).get("ownerReferences") or []
                if owners and not any(o.get("uid") in live_uids for o in owners):
                    prefix = "api/v1" if not resource.group else f"apis/{resource.group}/{resource.version}"
                    doomed.append(f"{prefix}/namespaces/{namespace}/{resource.plural}/{name}")
            for path in doomed:
                with contextlib.suppress(AssertionError, aiohttp.ClientError):
                    await self.call("DELETE", path)


class Operator:
    """The real operator (`python -m dverl_operator`, what `dverl operator` runs) in a subprocess."""

    def __init__(
        self, emulator: Emulator, identity: str = "op-a", *extra: str, env: dict[str, str] | None = None
    ):
        self.emulator = emulator
        self.identity = identity
        self.metrics_port = free_port()
        self.log_path = emulator.tmp / f"operator-{identity}.log"
        self.args = [
            sys.executable,
            "-m",
            "dverl_operator",
            "--all-namespaces",
            "--kubeconfig",
            str(emulator.kubeconfig),
            "--metrics-port",
            str(self.metrics_port),
            "--liveness-port",
            "0",
            "--identity",
            identity,
            "--lease-namespace",
            "default",
            "--lease-seconds",
            "5",
            "--renew-seconds",
            "0.5",
            "--resync-seconds",
            "2",
            "--status-interval",
            "0.3",
            "--backoff-base-seconds",
            "0.5",
            "--backoff-max-seconds",
            "2",
            *extra,
        ]
        self.env = {**os.environ, "DVERL_WORKER_IMAGE": WORKER_IMAGE, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(self.args, stdout=log, stderr=log, env=self.env, cwd=REPO)
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to clean up (a crash, an evicted pod)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


async def wait_for(
    check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll an async (or sync) check until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@contextlib.asynccontextmanager
async def emulator_and_operator(
    tmp: Path, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Emulator, Operator]]:
    async with Emulator(tmp) as emu:
        op = Operator(emu, "op-a", *extra, env=env).start()
        try:
            yield emu, op
        finally:
            await asyncio.to_thread(op.stop)  # the emulator must keep serving while it shuts down


def deep(obj: Any) -> Any:
    return copy.deepcopy(obj)


async def pods_if(emu: Emulator, job: str, count: int):
    """The job's pods once there are `count` of them (None before: a `wait_for` check)."""
    pods = await emu.pods(job)
    return pods if len(pods) == count else None
