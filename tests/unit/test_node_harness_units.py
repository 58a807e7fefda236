"""The test node's pure parts: env, volume files, DNS zone and answers, pod phase, command mapping,
the container's user, termination messages, the mount script."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from tests.support.node_harness import dns, dns_server, mounts
from tests.support.node_harness.env import EnvError, container_env
from tests.support.node_harness.image import ImageStandIn, resolve_argv
from tests.support.node_harness.pod import identity_of, user_wrapper
from tests.support.node_harness.status import ContainerState, phase_of, termination_message

SECRET = {"metadata": {"name": "s"}, "data": {"k": base64.b64encode(b"v").decode()}}
CONFIG = {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}}


def lookup(kind: str, name: str):
    return {("Secret", "s"): SECRET, ("ConfigMap", "c"): CONFIG}.get((kind, name))


POD = {"metadata": {"name": "p", "namespace": "ns", "labels": {"x": "y"}}, "spec": {"hostname": "h"}}


def test_env_follows_the_kubelet_order_and_references() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "c"}, "prefix": "CM_"}],
        "env": [
            {"name": "A", "value": "one"},
            {"name": "B", "value": "$(A)-$(MISSING)-$$(A)"},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "none", "key": "k", "optional": True}}},
            {
                "name": "MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
        ],
        "resources": {"limits": {"memory": "1536Ki"}},
    }
    env = container_env(POD, container, "10.0.0.9", lookup, ("10.0.0.1", 443))
    assert env["A"] == "one" and env["B"] == "one-$(MISSING)-$(A)"
    assert env["S"] == "v" and env["L"] == "y" and "OPT" not in env
    assert env["CM_a"] == "1" and env["CM_b"] == "2"
    assert env["MEM"] == "2"  # 1.5 MiB in MiB, rounded up
    assert env["HOSTNAME"] == "h" and env["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"


@pytest.mark.parametrize(
    ("item", "names"),
    [
        ({"secretKeyRef": {"name": "nope", "key": "k"}}, ["X", "Secret 'nope'"]),
        ({"secretKeyRef": {"name": "s", "key": "nokey"}}, ["X", "'nokey'"]),
        ({"configMapKeyRef": {"name": "c", "key": "z"}}, ["X", "'z'"]),
        ({"fieldRef": {"fieldPath": "spec.bogus"}}, ["X", "spec.bogus"]),
        ({"resourceFieldRef": {"resource": "limits.gpu"}}, ["X", "limits.gpu"]),
    ],
)
def test_an_env_reference_that_cannot_be_met_names_the_variable(item: dict, names: list[str]) -> None:
    with pytest.raises(EnvError) as err:
        container_env(POD, {"env": [{"name": "X", "valueFrom": item}]}, "", lookup)
    assert all(n in str(err.value) for n in names), err.value


def test_volume_files_choose_rename_and_mode_keys() -> None:
    volume = {"name": "v", "configMap": {"name": "c", "defaultMode": 0o600, "items": [
        {"key": "a", "path": "dir/first"}, {"key": "b", "path": "second", "mode": 0o400}]}}  # fmt: skip
    assert mounts.volume_files(volume, lookup) == {"dir/first": (b"1", 0o600), "second": (b"2", 0o400)}
    assert mounts.volume_files({"name": "w", "secret": {"secretName": "s"}}, lookup) == {"k": (b"v", 0o644)}
    with pytest.raises(mounts.VolumeError, match="'gone'"):
        mounts.volume_files({"name": "v", "configMap": {"name": "c", "items": [{"key": "gone"}]}}, lookup)
    with pytest.raises(mounts.VolumeError, match="Secret 'nope' not found"):
        mounts.volume_files({"name": "v", "secret": {"secretName": "nope"}}, lookup)
    assert (
        mounts.volume_files({"name": "v", "secret": {"secretName": "nope", "optional": True}}, lookup) == {}
    )


def _record(name: str, ip: str, ready: bool = True, ns: str = "default") -> dns.PodRecord:
    return dns.PodRecord(ns, name, ip, {"app": "a"}, name, "svc", ready)


def _service(publish: bool, ns: str = "default") -> dict:
    spec = {"clusterIP": "None", "selector": {"app": "a"}, "publishNotReadyAddresses": publish}
    return {"metadata": {"name": "svc", "namespace": ns}, "spec": spec}


def test_the_zone_has_each_selected_pod_and_the_service_and_honours_readiness() -> None:
    pods = [_record("a-0", "10.0.0.2"), _record("a-1", "10.0.0.3", ready=False)]
    zone = dns.zone(pods, [_service(publish=False)])
    assert zone == {
        "a-0.svc.default.svc.cluster.local": ["10.0.0.2"],
        "svc.default.svc.cluster.local": ["10.0.0.2"],
    }
    assert dns.zone(pods, [_service(publish=True)])["svc.default.svc.cluster.local"] == [
        "10.0.0.2",
        "10.0.0.3",
    ]
    assert dns.zone(pods, [_service(publish=True, ns="other")]) == {}  # a Service selects its namespace only
    hosts = dns.hosts_file(pods[0])
    assert "10.0.0.2\ta-0.svc.default.svc.cluster.local\ta-0" in hosts and "10.0.0.3" not in hosts
    assert "search default.svc.cluster.local svc.cluster.local cluster.local" in dns.resolv_conf(
        "default", "x"
    )


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 42, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def test_the_dns_server_answers_a_records_and_nxdomain() -> None:
    zone = {"a.svc.default.svc.cluster.local": ["10.0.0.2", "10.0.0.3"]}
    reply = dns_server.answer(_query("A.svc.default.svc.cluster.local"), zone.get)
    ident, flags, _, answers, _, _ = struct.unpack("!HHHHHH", reply[:12])
    assert (ident, flags & 0xF, answers) == (42, 0, 2)
    assert reply[-4:] == bytes([10, 0, 0, 3])
    aaaa = dns_server.answer(_query("a.svc.default.svc.cluster.local", qtype=28), zone.get)
    assert struct.unpack("!HHHHHH", aaaa[:12])[3] == 0 and struct.unpack("!H", aaaa[2:4])[0] & 0xF == 0
    missing = dns_server.answer(_query("b.svc.default.svc.cluster.local"), zone.get)
    assert struct.unpack("!H", missing[2:4])[0] & 0xF == 3
    assert dns_server.answer(b"\x00\x01", zone.get) is None


def _c(state: str, code: int | None = None, restarts: int = 0) -> ContainerState:
    c = ContainerState("c", "i", state=state, exit_code=code, restart_count=restarts)
    return c


@pytest.mark.parametrize(
    ("containers", "policy", "phase"),
    [
        ([_c("running")], "Never", "Running"),
        ([_c("terminated", 0)], "Never", "Succeeded"),
        ([_c("terminated", 1)], "Never", "Failed"),
        ([_c("terminated", 0), _c("terminated", 2)], "Never", "Failed"),
        ([_c("terminated", 1)], "OnFailure", "Running"),
        ([_c("terminated", 0)], "OnFailure", "Succeeded"),
        ([_c("terminated", 0)], "Always", "Running"),
        ([_c("waiting")], "Never", "Pending"),
        ([_c("waiting", restarts=1)], "Always", "Running"),
    ],
)
def test_pod_phase_follows_containers_and_restart_policy(containers, policy: str, phase: str) -> None:
    assert phase_of(containers, policy, True, False) == phase


def test_command_maps_onto_the_venv_and_args_replace_cmd(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    for name in ("dverl", "python"):
        (tmp_path / "bin" / name).touch()
    image = ImageStandIn(venv=tmp_path)
    assert resolve_argv({"command": ["dverl", "worker"]}, image, {}) == [
        str(tmp_path / "bin/dverl"),
        "worker",
    ]
    assert resolve_argv({"args": ["run", "$(F)"]}, image, {"F": "x.yaml"}) == [
        str(tmp_path / "bin/dverl"), "run", "x.yaml"]  # fmt: skip
    assert resolve_argv({}, image, {}) == [str(tmp_path / "bin/dverl"), "--help"]
    assert resolve_argv({"command": ["python3", "-c", "1"]}, image, {})[0] == str(tmp_path / "bin/python")
    with pytest.raises(FileNotFoundError, match="'no-such-tool'"):
        resolve_argv({"name": "w", "command": ["no-such-tool"]}, image, {})


def test_the_container_user_comes_from_the_pod_container_or_image() -> None:
    image = ImageStandIn()
    pod = {"spec": {"securityContext": {"runAsUser": 5, "fsGroup": 7, "supplementalGroups": [8]}}}
    container = {"securityContext": {"runAsUser": 6, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}  # fmt: skip
    who = identity_of(pod, container, image)
    assert (who.uid, who.groups, who.no_new_privs, who.drop_all) == (6, (7, 8), True, True)
    assert "--reuid=6" in user_wrapper(who) and "--no-new-privs" in user_wrapper(who)
    assert identity_of({"spec": {}}, {}, image).uid == image.user
    with pytest.raises(EnvError, match="runAsNonRoot"):
        identity_of({"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}}, {}, image)


def test_termination_messages_follow_the_policy() -> None:
    log = b"".join(f"line {i}\n".encode() for i in range(200)) + b"error: spec.model.path: missing\n"
    assert termination_message(b"wrote this", log, "FallbackToLogsOnError", 1) == "wrote this"
    fallback = termination_message(b"", log, "FallbackToLogsOnError", 2)
    assert fallback.endswith("error: spec.model.path: missing") and len(fallback.splitlines()) == 80
    assert termination_message(b"", log, "File", 2) == ""
    assert termination_message(b"", log, "FallbackToLogsOnError", 0) == ""


def test_the_mount_script_opens_every_source_before_mounting_anything(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    plan = [mounts.Mount("/tmp", tmp_path / "tmp"), mounts.Mount("/data", tmp_path / "data", read_only=True),
            mounts.Mount("/dev/shm", tmpfs_size="1024")]  # fmt: skip
    lines = mounts.mount_script(plan, {"/etc/hosts": hosts}, "h", tmp_path / "w", "/home/x").splitlines()
    first_mount = next(i for i, line in enumerate(lines) if line.startswith("mount"))
    opened = [line for line in lines[:first_mount] if line.startswith("exec ") and "<" in line]
    assert len(opened) == 4  # workdir, hosts, /tmp's and /data's sources
    assert "mount -o remount,bind,ro /data" in lines
    assert "mount -t tmpfs -o size=1024,mode=1777 tmpfs /dev/shm" in lines
    assert lines[-1] == 'exec "$@"'
