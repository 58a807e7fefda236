"""The operator's API layer (`dverl_operator.kube`) against kmock's Kubernetes API emulator: each verb
answers as the reconcile loop expects (a missing object is None or False, an existing one False on create),
and every failure is one of two errors: the server's answer with its status, reason and message
(`ApiError`), or no answer (`ApiUnreachable`).

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from lightkube import KubeConfig
from lightkube.config import models as kubeconfig

from dverl_operator.kube.client import Cluster
from dverl_operator.kube.connection import client_config
from dverl_operator.kube.discovery import Discovery
from dverl_operator.kube.errors import ApiError, ApiUnreachable
from tests.support.operator_fixtures import Emulator, tiny_spec

pytestmark = [pytest.mark.timeout(120)]


def pod(name: str, namespace: str = "default", **labels: str) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


async def test_each_verb_answers_as_the_reconcile_loop_expects(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu, Cluster(client_config(str(emu.kubeconfig))) as cluster:
        # The verbs the operator holds on each kind (the chart's Role): it gets ConfigMaps, never one Pod.
        assert await cluster.get("ConfigMap", "default", "c1") is None
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"k": "v"}}
        assert await cluster.create("ConfigMap", "default", config_map) is True
        got = await cluster.get("ConfigMap", "default", "c1")
        assert got is not None and got["data"] == {"k": "v"} and type(got) is dict
        assert await cluster.create("Pod", "default", pod("p1", app="a")) is True
        assert await cluster.create("Pod", "default", pod("p1", app="a")) is False  # already there
        assert await cluster.create("Pod", "default", pod("p2", app="b")) is True
        # The emulator filters by label selector as a real server does.
        assert [p["metadata"]["name"] for p in await cluster.list("Pod", "default", {"app": "a"})] == ["p1"]
        patched = await cluster.patch("Pod", "default", "p1", {"metadata": {"annotations": {"k": "v"}}})
        assert patched is not None and patched["metadata"]["annotations"] == {"k": "v"}
        assert type(patched) is dict  # plain JSON for the pure code, not a client object
        assert await cluster.patch("Pod", "default", "gone", {"metadata": {"labels": {"x": "y"}}}) is None
        assert await cluster.delete("Pod", "default", "p1") is True
        assert await cluster.delete("Pod", "default", "p1") is False
        assert await cluster.list("Pod", "default", {"app": "a"}) == []


async def test_a_custom_resource_and_its_status_subresource(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu, Cluster(client_config(str(emu.kubeconfig))) as cluster:
        await emu.create_job("j", tiny_spec())
        changed = await cluster.patch("RLHFJob", "default", "j", {"status": {"phase": "Running"}}, "status")
        assert changed is not None and changed["status"] == {"phase": "Running"}
        assert (await emu.job("j"))["status"] == {"phase": "Running"}
        with pytest.raises(ValueError, match="scale"):
            await cluster.patch("RLHFJob", "default", "j", {"spec": {}}, "scale")


async def test_a_refusal_names_its_status_reason_and_the_servers_message(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu, Cluster(client_config(str(emu.kubeconfig))) as cluster:
        await emu.namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
        with pytest.raises(ApiError) as caught:
            await cluster.create("Pod", "locked", pod("x", "locked"))  # no security context: refused
        assert (caught.value.status, caught.value.reason) == (403, "Forbidden")
        assert caught.value.message.startswith(
            'pods "x" is forbidden: violates PodSecurity "restricted:latest"'
        )
        assert "POST api/v1/namespaces/locked/pods: HTTP 403 Forbidden" in str(caught.value)
        assert await cluster.namespace_labels("locked") == {
            "pod-security.kubernetes.io/enforce": "restricted"
        }
        assert await cluster.namespace_labels("nowhere") == {}
        emu.kmock["get /api/v1/namespaces/broken/configmaps/c"] << 500 << b"upstream exploded"
        with pytest.raises(ApiError) as caught:
            await cluster.get("ConfigMap", "broken", "c")  # not a Status body: its text is the message
        assert caught.value.status == 500 and "upstream exploded" in caught.value.message


async def test_no_answer_is_api_unreachable_an_oserror() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    config = KubeConfig.from_one(
        cluster=kubeconfig.Cluster(server=f"http://127.0.0.1:{port}"), user=kubeconfig.User(token="t")
    )
    async with Cluster(config, timeout=5.0) as cluster:
        with pytest.raises(ApiUnreachable) as caught:
            await cluster.get("Pod", "default", "p")
    assert isinstance(caught.value, OSError)  # the reconcile loop retries it as a cluster failure
    discovery = Discovery(config, timeout=5.0)
    try:
        with pytest.raises(ApiUnreachable):
            await discovery.resources("dverl.io", "v1alpha1")
    finally:
        await discovery.close()


async def test_discovery_lists_what_a_group_version_serves(tmp_path: Path) -> None:
    async with Emulator(tmp_path) as emu:
        discovery = Discovery(client_config(str(emu.kubeconfig)))
        try:
            assert "rlhfjobs" in await discovery.resources("dverl.io", "v1alpha1")
            with pytest.raises(ApiError) as caught:
                await discovery.resources("nothing.example", "v1")
            assert caught.value.status == 404
        finally:
            await discovery.close()


async def test_a_namespaced_operator_reads_only_its_own_namespaces_labels(tmp_path: Path) -> None:
    """The chart's Role grants get on namespaces; as the API server files a namespace's GET under that
    namespace, a Role in `team` reads `team` and no other."""
    async with (
        Emulator(tmp_path, chart_values=["watchNamespaces={team}"]) as emu,
        Cluster(client_config(str(emu.kubeconfig))) as cluster,
    ):
        await emu.namespace("team", {"pod-security.kubernetes.io/enforce": "baseline"})
        await emu.namespace("other", {"pod-security.kubernetes.io/enforce": "privileged"})
        assert await cluster.namespace_labels("team") == {"pod-security.kubernetes.io/enforce": "baseline"}
        with pytest.raises(ApiError) as caught:
            await cluster.namespace_labels("other")
        assert caught.value.status == 403
        assert (
            'cannot get resource "namespaces" in API group "" in the namespace "other"'
            in caught.value.message
        )
