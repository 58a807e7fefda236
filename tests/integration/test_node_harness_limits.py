"""The test node refuses and enforces as a kubelet and scheduler do: a container over its memory limit is
killed by the kernel (OOMKilled, 137), probes (httpGet, tcpSocket, exec) run with their periods and
thresholds (a failed liveness probe restarts the container), pods go only onto nodes with room for their
GPUs, CPU and memory, matching selectors and tolerated taints (else Pending, Unschedulable, with the
scheduler's message), and pods on two nodes on separate bridges reach each other through a router."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.node_harness import Node, refused
from tests.support.node_harness.cgroups import unavailable
from tests.support.node_harness.node import nodes
from tests.support.node_harness.scheduling import NodeInfo
from tests.support.operator_fixtures import Emulator, wait_for

REASON = refused()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}")
NO_CGROUP = unavailable()
pytestmark = [pytest.mark.timeout(240)]


def _pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "test", **container}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [main], **spec},
    }


async def _create(emu: Emulator, pod: dict[str, Any]) -> None:
    await emu.call("POST", "api/v1/namespaces/default/pods", pod)


async def _until(emu: Emulator, name: str, check, what: str, timeout: float = 90) -> dict[str, Any]:
    async def probe() -> Any:
        pod = await emu.get("pods", name)
        return pod if pod and check(pod) else None

    return await wait_for(probe, timeout=timeout, what=f"{name}: {what}")


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    return ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]


@needs_namespaces
@pytest.mark.skipif(NO_CGROUP is not None, reason=f"memory limits need a memory cgroup: {NO_CGROUP}")
async def test_a_container_over_its_memory_limit_is_oomkilled_with_137(tmp_path: Path) -> None:
    grow = "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(2**24))\n    time.sleep(0.01)"
    within = "x = bytearray(8 * 2**20); print('fine')"
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path):
        limits = {"memory": "96Mi", "cpu": "1"}
        await _create(emu, _pod("hog", {"command": ["python", "-c", grow], "resources": {"limits": limits}}))
        await _create(
            emu, _pod("modest", {"command": ["python", "-c", within], "resources": {"limits": limits}})
        )
        hog = await _until(emu, "hog", lambda p: p["status"].get("phase") == "Failed", "Failed")
        ended = _main(hog)["state"]["terminated"]
        assert (ended["exitCode"], ended["reason"]) == (137, "OOMKilled")
        modest = await _until(emu, "modest", lambda p: p["status"].get("phase") == "Succeeded", "Succeeded")
        assert _main(modest)["state"]["terminated"]["reason"] == "Completed"


@needs_namespaces
@pytest.mark.skipif(NO_CGROUP is not None, reason=f"memory limits need a memory cgroup: {NO_CGROUP}")
async def test_an_oomkilled_container_restarts_with_the_kill_in_its_last_state(tmp_path: Path) -> None:
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 2**20))\n"
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path):
        container = {"command": ["python", "-c", grow], "resources": {"limits": {"memory": "64Mi"}}}
        await _create(emu, _pod("again", container, restartPolicy="Always"))
        pod = await _until(emu, "again", lambda p: _main(p).get("restartCount", 0) >= 1, "a restart")
        last = _main(pod)["lastState"]["terminated"]
        assert (last["exitCode"], last["reason"]) == (137, "OOMKilled")


SERVER = r"""
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        healthy = not os.path.exists("/tmp/sick") and self.path == "/healthz"
        self.send_response(200 if healthy else 500)
        self.end_headers()
    def log_message(self, *a): pass
open("/tmp/ready", "w").close() if len(sys.argv) > 1 else None
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


@needs_namespaces
async def test_a_failing_liveness_probe_restarts_the_container(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path):
        container = {
            "command": ["python", "-c", SERVER],
            "ports": [{"name": "http", "containerPort": 8080}],
            "livenessProbe": {
                "httpGet": {"path": "/broken", "port": "http"},
                "periodSeconds": 1,
                "failureThreshold": 3,
            },
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        }
        await _create(emu, _pod("sick", container, restartPolicy="Always"))
        pod = await _until(
            emu, "sick", lambda p: _main(p).get("restartCount", 0) >= 2, "two liveness restarts"
        )
        assert _main(pod)["lastState"]["terminated"]["exitCode"] in (
            137,
            143,
        )  # SIGTERM, or SIGKILL after grace
        healthy = {
            **container,
            "livenessProbe": {
                "httpGet": {"path": "/healthz", "port": 8080},
                "periodSeconds": 1,
                "initialDelaySeconds": 5,
            },
        }
        await _create(emu, _pod("well", healthy, restartPolicy="Always"))
        await _until(emu, "well", lambda p: _main(p).get("ready") is True, "ready")
        await _until(emu, "sick", lambda p: _main(p).get("restartCount", 0) >= 3, "a third restart")
        well = await emu.get("pods", "well")
        assert _main(well)["restartCount"] == 0 and _main(well)["ready"] is True


@needs_namespaces
async def test_an_exec_readiness_probe_sets_and_clears_ready(tmp_path: Path) -> None:
    script = (
        "import os, time\ntime.sleep(1.5)\nopen('/tmp/ok', 'w').close()\n"
        "time.sleep(3)\nos.remove('/tmp/ok')\ntime.sleep(60)\n"
    )
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path):
        container = {
            "command": ["python", "-c", script],
            "readinessProbe": {
                "exec": {"command": ["test", "-e", "/tmp/ok"]},
                "periodSeconds": 1,
                "failureThreshold": 1,
            },
        }
        await _create(emu, _pod("flip", container))
        pod = await emu.get("pods", "flip")
        await _until(emu, "flip", lambda p: _main(p).get("ready") is True, "ready once the file exists")
        pod = await _until(
            emu,
            "flip",
            lambda p: (
                p["status"].get("phase") == "Running"
                and _main(p).get("ready") is False
                and _main(p).get("started")
            ),
            "not ready once it is gone",
        )
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"


def _scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), None
    )


GPU_NODES = [
    NodeInfo("node-a", {"cpu": "4", "memory": "8Gi", "pods": "10", "nvidia.com/gpu": "1"}, {"zone": "a"}),
    NodeInfo("node-b", {"cpu": "4", "memory": "8Gi", "pods": "10", "nvidia.com/gpu": "1"}, {"zone": "b"},
             taints=[{"key": "dedicated", "value": "rl", "effect": "NoSchedule"}]),
]  # fmt: skip


@needs_namespaces
async def test_pods_go_only_where_they_fit_else_pending_unschedulable(tmp_path: Path) -> None:
    sleeper = {"command": ["python", "-c", "import time; time.sleep(60)"]}

    def gpus(n: int) -> dict[str, Any]:
        return {**sleeper, "resources": {"limits": {"nvidia.com/gpu": str(n), "cpu": "1", "memory": "1Gi"}}}

    async with Emulator(tmp_path) as emu, nodes(emu, tmp_path, GPU_NODES):
        await _create(emu, _pod("two-gpus", gpus(2)))
        pod = await _until(
            emu, "two-gpus", lambda p: (_scheduled(p) or {}).get("status") == "False", "unschedulable"
        )
        cond = _scheduled(pod)
        assert pod["status"]["phase"] == "Pending" and cond["reason"] == "Unschedulable"
        assert cond["message"] == (
            "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "1 node(s) had untolerated taint {dedicated: rl}."
        )
        assert not pod["spec"].get("nodeName")
        tolerant = [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]
        await _create(emu, _pod("first", gpus(1), nodeSelector={"zone": "a"}))
        first = await _until(emu, "first", lambda p: p["status"].get("phase") == "Running", "Running")
        assert first["spec"]["nodeName"] == "node-a"
        await _create(emu, _pod("second", gpus(1)))  # node-a is full and node-b's taint is not tolerated
        second = await _until(
            emu, "second", lambda p: (_scheduled(p) or {}).get("status") == "False", "unschedulable"
        )
        assert _scheduled(second)["message"] == (
            "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "1 node(s) had untolerated taint {dedicated: rl}."
        )
        await _create(emu, _pod("third", gpus(1), tolerations=tolerant))
        third = await _until(emu, "third", lambda p: p["status"].get("phase") == "Running", "Running")
        assert third["spec"]["nodeName"] == "node-b"
        await _create(emu, _pod("elsewhere", sleeper, nodeSelector={"zone": "c"}, tolerations=tolerant))
        lost = await _until(
            emu, "elsewhere", lambda p: (_scheduled(p) or {}).get("status") == "False", "unschedulable"
        )
        assert _scheduled(lost)["message"] == (
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
        )
        await _create(
            emu,
            _pod(
                "huge",
                {**sleeper, "resources": {"limits": {"cpu": "8", "memory": "1Gi"}}},
                tolerations=tolerant,
            ),
        )
        huge = await _until(
            emu, "huge", lambda p: (_scheduled(p) or {}).get("status") == "False", "unschedulable"
        )
        assert _scheduled(huge)["message"] == "0/2 nodes are available: 2 Insufficient cpu."
        await emu.delete_pod("first")  # room on node-a again: the waiting pod is bound there
        second = await _until(
            emu, "second", lambda p: p["status"].get("phase") == "Running", "Running", timeout=120
        )
        assert second["spec"]["nodeName"] == "node-a"


@needs_namespaces
async def test_pods_on_two_nodes_reach_each_other_through_routing(tmp_path: Path) -> None:
    serve = "import http.server; http.server.HTTPServer(('0.0.0.0', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"  # noqa: E501
    two = [NodeInfo("node-a", labels={"zone": "a"}), NodeInfo("node-b", labels={"zone": "b"})]
    async with Emulator(tmp_path) as emu, nodes(emu, tmp_path, two) as (a, b):
        assert a.bridge.subnet != b.bridge.subnet
        server = {
            "command": ["python", "-c", serve],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        }
        await _create(emu, _pod("server", server, nodeSelector={"zone": "b"}))
        up = await _until(emu, "server", lambda p: _main(p).get("ready") is True, "serving")
        address = up["status"]["podIP"]
        assert ipaddress.ip_address(address) in b.bridge.net and up["spec"]["nodeName"] == "node-b"
        fetch = (
            "import json, socket, urllib.request\n"
            f"body = urllib.request.urlopen('http://{address}:8080/', timeout=10).status\n"
            "print(json.dumps({'status': body}))\n"
        )
        await _create(emu, _pod("client", {"command": ["python", "-c", fetch]}, nodeSelector={"zone": "a"}))
        done = await _until(
            emu, "client", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "done"
        )
        assert ipaddress.ip_address(done["status"]["podIP"]) in a.bridge.net
        assert done["status"]["phase"] == "Succeeded", a.logs("client")
        assert json.loads(a.logs("client").strip().splitlines()[-1]) == {"status": 200}
