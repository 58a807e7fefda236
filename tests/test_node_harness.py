"""The test node itself: real pods (processes in their own network and mount namespaces) run from pod
objects in the API emulator, checked from inside (what a container sees) and from the API (what the
kubelet reports)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from node_harness import Node, refused
from operator_fixtures import Emulator, wait_for

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
open("/data/report.json", "w").write(json.dumps(out))
"""


def _pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "harness"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "test", **container}],
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
    main = status["containerStatuses"][0]
    assert main["state"]["terminated"]["exitCode"] == 0
    assert main["state"]["terminated"]["reason"] == "Completed"
    assert main["restartCount"] == 0
    assert not Path("/etc/creds/tls.key").exists(), "a pod's volume leaked onto the host"
