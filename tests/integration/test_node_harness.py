"""The test node itself: real pods (processes in their own network and mount namespaces) run from pod
objects in the API emulator, checked from inside (what a container sees) and from the API (what the
kubelet reports)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.node_harness import Node, refused
from tests.support.operator_fixtures import Emulator, wait_for

REASON = refused()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}")

PROBE = r"""
import json, os, socket, stat, sys
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "host": socket.gethostname()}
names = ("PLAIN", "TOKEN", "COLOR", "POD", "NS", "IP", "CPUS", "EXPANDED")
out["env"] = {k: os.environ.get(k) for k in names}
files = {}
for path in ("/etc/creds/tls.key", "/etc/creds/nested/ca.crt", "/etc/cfg/color"):
    st = os.stat(path)
    files[path] = {"mode": oct(stat.S_IMODE(st.st_mode)), "gid": st.st_gid, "text": open(path).read()}
out["files"] = files
shm = os.statvfs("/dev/shm")
kinds = [line.split()[2] for line in open("/proc/mounts") if line.split()[1] == "/dev/shm"]
out["shm"] = [shm.f_blocks * shm.f_frsize, kinds[-1]]
out["scratch_writable"] = os.access("/scratch", os.W_OK)
out["data"] = open("/data/input.txt").read()
try:
    open(os.path.join(os.getcwd(), "layer"), "w")
    out["root"] = "writable"
except OSError as exc:
    out["root"] = exc.strerror
open("/data/report.json", "w").write(json.dumps(out))
"""


def _pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A pod of the image's user (10001) whose fsGroup makes its claims writable to it."""
    main = {"name": "main", "image": "test", **container}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "harness"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"fsGroup": 10001},
            "containers": [main],
            **spec,
        },
    }


async def _create(emu: Emulator, obj: dict[str, Any]) -> None:
    plural = {"Pod": "pods", "Secret": "secrets", "ConfigMap": "configmaps", "Service": "services"}[
        obj["kind"]
    ]
    await emu.call("POST", f"api/v1/namespaces/default/{plural}", obj)


async def _phase(emu: Emulator, name: str, *phases: str) -> dict[str, Any]:
    async def check() -> Any:
        pod = await emu.get("pods", name)
        return pod if pod and (pod.get("status") or {}).get("phase") in phases else None

    return await wait_for(check, timeout=60, what=f"pod {name} in {phases}")


@needs_namespaces
async def test_a_pod_sees_its_env_volumes_and_user_as_a_container_would(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    (claim / "sub").mkdir(parents=True)
    (claim / "sub" / "input.txt").write_text("from the claim")
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path, claims={"rl-data": claim}) as node:
        await _create(emu, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                            "data": {"tls.key": base64.b64encode(b"KEY").decode(),
                                     "ca.crt": base64.b64encode(b"CA").decode(),
                                     "token": base64.b64encode(b"s3cret").decode()}})  # fmt: skip
        await _create(emu, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                            "data": {"color": "blue"}})  # fmt: skip
        container = {
            "command": ["python", "-c", PROBE],
            "securityContext": {"readOnlyRootFilesystem": True},
            "resources": {"limits": {"cpu": "1500m"}},
            "env": [
                {"name": "PLAIN", "value": "plain"},
                {"name": "EXPANDED", "value": "$(PLAIN)-and-$$(PLAIN)"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "color"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            ],
            "volumeMounts": [
                {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                {"name": "cfg", "mountPath": "/etc/cfg"},
                {"name": "data", "mountPath": "/data", "subPath": "sub"},
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "shm", "mountPath": "/dev/shm"},
            ],
        }
        volumes = [
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o440, "items": [
                {"key": "tls.key", "path": "tls.key", "mode": 0o400},
                {"key": "ca.crt", "path": "nested/ca.crt"}]}},
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "rl-data"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ]  # fmt: skip
        pod = _pod("probe", container, volumes=volumes, hostname="probe-host",
                   securityContext={"runAsUser": 2000, "runAsGroup": 2001, "fsGroup": 3000})  # fmt: skip
        await _create(emu, pod)
        done = await _phase(emu, "probe", "Succeeded", "Failed")
        assert done["status"]["phase"] == "Succeeded", node.all_logs()
    report = json.loads((claim / "sub" / "report.json").read_text())
    status = done["status"]
    assert (report["uid"], report["gid"]) == (2000, 2001)
    assert 3000 in report["groups"]
    assert report["host"] == "probe-host"
    assert report["env"] == {
        "PLAIN": "plain",
        "EXPANDED": "plain-and-$(PLAIN)",
        "TOKEN": "s3cret",
        "COLOR": "blue",
        "POD": "probe",
        "NS": "default",
        "IP": status["podIP"],
        "CPUS": "2",
    }
    files = report["files"]
    assert files["/etc/creds/tls.key"] == {"mode": "0o440", "gid": 3000, "text": "KEY"}  # fsGroup adds g+r
    assert files["/etc/creds/nested/ca.crt"] == {"mode": "0o440", "gid": 3000, "text": "CA"}
    assert files["/etc/cfg/color"]["mode"] == "0o644" and files["/etc/cfg/color"]["text"] == "blue"
    assert report["shm"] == [16 * 2**20, "tmpfs"]  # medium Memory, sized by sizeLimit
    assert report["scratch_writable"] is True
    assert report["data"] == "from the claim"
    assert report["root"] == "Read-only file system"  # readOnlyRootFilesystem: only volumes take writes
    main = status["containerStatuses"][0]
    assert main["state"]["terminated"]["exitCode"] == 0
    assert main["state"]["terminated"]["reason"] == "Completed"
    assert main["restartCount"] == 0
    assert not Path("/etc/creds/tls.key").exists(), "a pod's volume leaked onto the host"


IGNORES_SIGTERM = r"""
import signal, sys, time
def note(*_):
    open("/data/sigterm", "w").write("got it")
signal.signal(signal.SIGTERM, note)
open("/data/started", "w").write("yes")
while True:
    time.sleep(0.1)
"""

LEAVES_ON_SIGTERM = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
open("/data/started", "w").write("yes")
while True:
    time.sleep(0.1)
"""


@needs_namespaces
async def test_deleting_a_pod_sends_sigterm_then_sigkill_after_its_grace_period(tmp_path: Path) -> None:
    claims = {"stubborn": tmp_path / "stubborn", "polite": tmp_path / "polite"}
    for folder in claims.values():
        folder.mkdir()
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path, claims=claims) as node:
        for name, script, grace in (("stubborn", IGNORES_SIGTERM, 1), ("polite", LEAVES_ON_SIGTERM, 60)):
            container = {
                "command": ["python", "-c", script],
                "volumeMounts": [{"name": "d", "mountPath": "/data"}],
            }
            volumes = [{"name": "d", "persistentVolumeClaim": {"claimName": name}}]
            await _create(emu, _pod(name, container, volumes=volumes, terminationGracePeriodSeconds=grace))
        for name, folder in claims.items():
            await wait_for(lambda f=folder: (f / "started").exists(), timeout=60, what=f"{name} to start")
        for name in claims:
            await emu.delete_pod(name)
        # Graceful deletion: the object stays, marked, while its processes stop.
        marked = await emu.get("pods", "stubborn")
        assert marked is not None and marked["metadata"].get("deletionTimestamp")
        for name in claims:
            await wait_for(lambda n=name: _gone(emu, n), timeout=60, what=f"{name} to be deleted")
        stubborn, polite = node.running("stubborn"), node.running("polite")
    assert (claims["stubborn"] / "sigterm").read_text() == "got it"  # SIGTERM first...
    assert stubborn.runner.state.main[0].exit_code == 137  # ...then SIGKILL when the grace ran out
    assert polite.runner.state.main[0].exit_code == 143  # left on SIGTERM, long before its 60 s grace


async def _gone(emu: Emulator, name: str) -> bool:
    return await emu.get("pods", name) is None


FAILS_TWICE = r"""
import pathlib, sys
count = pathlib.Path("/data/runs")
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
print(f"run {n}")
sys.exit(0 if n == 3 else 3)
"""


@needs_namespaces
async def test_restart_policy_is_honoured_and_restarts_are_counted(tmp_path: Path) -> None:
    claims = {"again": tmp_path / "again", "once": tmp_path / "once"}
    for folder in claims.values():
        folder.mkdir()
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path, claims=claims) as node:
        for name, policy in (("again", "OnFailure"), ("once", "Never")):
            container = {
                "command": ["python", "-c", FAILS_TWICE],
                "volumeMounts": [{"name": "d", "mountPath": "/data"}],
            }
            volumes = [{"name": "d", "persistentVolumeClaim": {"claimName": name}}]
            pod = _pod(name, container, volumes=volumes)
            pod["spec"]["restartPolicy"] = policy
            await _create(emu, pod)
        again = await _phase(emu, "again", "Succeeded", "Failed")
        once = await _phase(emu, "once", "Succeeded", "Failed")
        logs = node.logs("again")
    assert again["status"]["phase"] == "Succeeded", logs
    status = again["status"]["containerStatuses"][0]
    assert status["restartCount"] == 2
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert (claims["again"] / "runs").read_text() == "3"
    assert once["status"]["phase"] == "Failed"
    ended = once["status"]["containerStatuses"][0]
    assert ended["restartCount"] == 0
    assert ended["state"]["terminated"] == {**ended["state"]["terminated"], "exitCode": 3, "reason": "Error"}
    assert (claims["once"] / "runs").read_text() == "1"


SERVES_ITS_NAME = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()
"""

ASKS_BY_NAME = r"""
import socket, time
out = {}
for name in ("server-0.names.default.svc.cluster.local", "server-0.names.default.svc", "server-0.names"):
    for _ in range(100):
        try:
            with socket.create_connection((name, 7000), timeout=2) as c:
                out[name] = [socket.gethostbyname(name), c.recv(100).decode()]
            break
        except OSError:
            time.sleep(0.2)
try:
    socket.gethostbyname("nobody.names.default.svc.cluster.local")
    out["nobody"] = "resolved"
except OSError:
    out["nobody"] = "unknown"
open("/data/answers.json", "w").write(__import__("json").dumps(out))
"""


@needs_namespaces
async def test_a_headless_service_gives_each_pod_a_name_the_others_resolve(tmp_path: Path) -> None:
    claim = tmp_path / "answers"
    claim.mkdir()
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path, claims={"answers": claim}) as node:
        headless = {"clusterIP": "None", "selector": {"app": "harness"}, "publishNotReadyAddresses": True}
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "names"}, "spec": headless}
        await _create(emu, service)
        server = _pod(
            "server-0", {"command": ["python", "-c", SERVES_ITS_NAME]}, hostname="server-0", subdomain="names"
        )
        client = _pod(
            "client",
            {
                "command": ["python", "-c", ASKS_BY_NAME],
                "volumeMounts": [{"name": "d", "mountPath": "/data"}],
            },
            volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "answers"}}],
        )
        await _create(emu, server)
        await _create(emu, client)
        done = await _phase(emu, "client", "Succeeded", "Failed")
        served = await emu.get("pods", "server-0")
        assert done["status"]["phase"] == "Succeeded", node.all_logs()
    answers = json.loads((claim / "answers.json").read_text())
    ip = served["status"]["podIP"]
    for name in ("server-0.names.default.svc.cluster.local", "server-0.names.default.svc", "server-0.names"):
        assert answers[name] == [ip, "server-0"], answers
    assert answers["nobody"] == "unknown"
    assert ip != done["status"]["podIP"]


@needs_namespaces
async def test_an_eviction_stops_the_pod_and_reports_it_evicted(tmp_path: Path) -> None:
    claim = tmp_path / "evicted"
    claim.mkdir()
    async with Emulator(tmp_path) as emu, Node(emu, tmp_path, claims={"evicted": claim}) as node:
        container = {
            "command": ["python", "-c", LEAVES_ON_SIGTERM],
            "volumeMounts": [{"name": "d", "mountPath": "/data"}],
        }
        volumes = [{"name": "d", "persistentVolumeClaim": {"claimName": "evicted"}}]
        await _create(emu, _pod("victim", container, volumes=volumes))
        await wait_for(lambda: (claim / "started").exists(), timeout=60, what="the pod to start")
        await node.evict("victim")
        pod = await emu.get("pods", "victim")
    status = pod["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Evicted")
    target = next(c for c in status["conditions"] if c["type"] == "DisruptionTarget")
    assert target["status"] == "True" and target["reason"] == "TerminationByKubelet"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert pod["metadata"].get("deletionTimestamp") is None  # evicted pods stay until someone deletes them
