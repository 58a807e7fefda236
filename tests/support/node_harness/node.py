"""The node: watches the emulator's pods and runs each one (pod.py) on the bridge (netns.py), writing
what happens back to the pod's status, as a kubelet does.

A pod the node admits gets its finalizer, so deleting it is graceful as on a cluster: the API object
stays (with deletionTimestamp) while its processes get SIGTERM and, after the grace period, SIGKILL;
then the node drops its finalizer and the object goes. `evict` plays the kubelet's node-pressure
eviction (DisruptionTarget, SIGTERM, then phase Failed with reason Evicted); `paused` freezes a pod's
processes, as `docker pause` does, so a test deals a fault while the job cannot move on. Cluster DNS is
served on the bridge's address (dns_server.py) and named in every pod's resolv.conf and the operator's.

A node runs only the pods bound to it (`spec.nodeName`). A node started alone schedules for itself; `nodes`
starts several, each on its own bridge joined by a router, with one scheduler (scheduling.py) binding
each pod to a node with room for it, or leaving it Pending with PodScheduled=False, reason Unschedulable
and the scheduler's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dverl_operator.objects.pod_state import pod_phase
from tests.support.node_harness import cgroups, dns, dns_server, gangs, gpus
from tests.support.node_harness.image import ImageStandIn, node_images
from tests.support.node_harness.netns import Bridge, Router
from tests.support.node_harness.pod import PodRunner, Settings
from tests.support.node_harness.scheduling import NodeInfo, choose
from tests.support.node_harness.status import PodState, pod_status, qos_class, stamp

FINALIZER = "node-harness.dverl.io/kubelet"
log = logging.getLogger(__name__)


@dataclass
class RunningPod:
    key: tuple[str, str]
    uid: str
    runner: PodRunner
    task: asyncio.Task[PodState]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Node:
    """`async with Node(emulator, tmp, claims={"rl-data": folder}) as node:` runs every pod created while
    inside. `emulator` is tests/operator_fixtures.Emulator. `image` plays the worker image (default: the
    test venv); with `vllm_venv` (image.py `vllm_venv`) the node also holds the `-vllm-cpu` flavour, played
    by that venv. A node whose `info` advertises GPUs (gpus.py `gpu_node`) plays a GPU pool's node: with a
    vLLM venv it also holds the CUDA `-vllm` flavour, and a container that asks for GPUs gets the worker's
    CPU override (`DVERL_DEVICE=cpu`) where a device plugin would hand it its GPUs."""

    def __init__(
        self,
        emulator: Any,
        tmp: Path,
        claims: Mapping[str, Path] | None = None,
        image: ImageStandIn | None = None,
        vllm_venv: Path | None = None,
        poll_seconds: float = 0.2,
        info: NodeInfo | None = None,
        schedules: bool = True,
    ) -> None:
        self.emulator = emulator
        self.info = info or NodeInfo(name="node-1")
        self.dir = tmp / "node" if info is None else tmp / "nodes" / self.info.name
        self.bridge = Bridge()
        self.settings = Settings(
            images=node_images(image or ImageStandIn(), vllm_venv, gpus.plays_gpus(self.info)),
            claims={k: Path(v) for k, v in (claims or {}).items()},
            memory=cgroups.hierarchy() if cgroups.unavailable() is None else None,
            device_env=functools.partial(gpus.device_env, self.info),
        )
        self.scheduler: Scheduler | None = Scheduler(emulator, [self]) if schedules else None
        self.poll_seconds = poll_seconds
        self.pods: dict[str, RunningPod] = {}
        """By uid, every pod this node ran, finished ones included."""
        self.operator_hosts = self.dir / "operator-hosts"
        self.resolv_conf = self.dir / "resolv.conf"
        self._zone: dict[str, list[str]] = {}
        self._dns: Any = None
        self._made: list[Path] = []
        self._loop: asyncio.Task[None] | None = None
        self._side: set[asyncio.Task[Any]] = set()
        self._services: list[dict[str, Any]] = []
        self._records: list[dns.PodRecord] = []
        self._deleting: set[str] = set()

    # ------------------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Node:
        USERS.mkdir(parents=True, exist_ok=True)
        (USERS / str(os.getpid())).touch()
        _OPEN.add(id(self))
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        self.operator_hosts.write_text(dns.hosts_file(None))
        os.chmod(self.operator_hosts, 0o644)
        await asyncio.to_thread(self.bridge.open)
        self.settings.api_server = (self.bridge.gateway, int(self.emulator.url.port))
        self._dns = await dns_server.serve(self.bridge.gateway, self._zone.get)
        self.resolv_conf.write_text(dns.resolv_conf("default", self.bridge.gateway))
        os.chmod(self.resolv_conf, 0o644)
        self._loop = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        for task in list(self._side):
            task.cancel()
        for running in self.pods.values():
            running.runner.kill_now()
        for running in self.pods.values():
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(running.task, 10)
        if self._dns is not None:
            self._dns.close()
        await asyncio.to_thread(self.bridge.close)
        _OPEN.discard(id(self))
        if not _OPEN:
            with contextlib.suppress(OSError):
                (USERS / str(os.getpid())).unlink()
        others = _others_running()
        for path in reversed(self._made):
            if others and not path.name.startswith(MARKER):
                continue  # a file mountpoint or folder another process's pods may still be using
            with contextlib.suppress(OSError):
                path.unlink() if path.is_file() else path.rmdir()

    def operator_command(self, argv: Sequence[str]) -> list[str]:
        """The operator's command line run in a mount namespace whose resolv.conf names the cluster's DNS
        (and /etc/hosts its records), so it dials the coordinator by its Service name and checks its
        certificate for that name, as an operator pod in the cluster does."""
        script = 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
        return ["/usr/bin/unshare", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", script, str(self.operator_hosts), str(self.resolv_conf), *argv]  # fmt: skip

    # ------------------------------------------------------------------------------ queries
    def running(self, name: str, namespace: str = "default") -> RunningPod | None:
        """The newest incarnation of a pod by name."""
        found = [p for p in self.pods.values() if p.key == (namespace, name)]
        return found[-1] if found else None

    def logs(self, name: str, namespace: str = "default") -> str:
        """Every container log of every incarnation of the pod, for failure messages."""
        out = []
        for running in self.pods.values():
            if running.key == (namespace, name):
                for container, path in running.runner.logs.items():
                    out.append(
                        f"=== {name} ({running.uid[:8]}) {container}\n{path.read_text(errors='replace')}"
                    )
        return "\n".join(out)

    def all_logs(self) -> str:
        return "\n".join(self.logs(n, ns) for ns, n in sorted({p.key for p in self.pods.values()}))

    @contextlib.contextmanager
    def paused(self, name: str, namespace: str = "default") -> Iterator[RunningPod]:
        """The pod's processes stopped (SIGSTOP) for the block and continued after, however it ends: what
        happens meanwhile (a pod deleted and replaced, a signal sent) lands before it can run on."""
        running = self.running(name, namespace)
        assert running is not None, f"pod {namespace}/{name} is not on this node"
        running.runner.pause()
        try:
            yield running
        finally:
            running.runner.resume()

    async def evict(self, name: str, namespace: str = "default", resource: str = "memory") -> None:
        """Node-pressure eviction: DisruptionTarget, SIGTERM then SIGKILL after the grace period, then
        phase Failed with reason Evicted; the pod is not restarted."""
        running = self.running(name, namespace)
        assert running is not None, f"pod {namespace}/{name} is not on this node"
        state = running.runner.state
        message = f"The node was low on resource: {resource}."
        state.disruption = ("TerminationByKubelet", message)
        await self._report(running, state)
        await running.runner.stop()
        await asyncio.wait({running.task}, timeout=30)
        state.phase, state.reason, state.message = "Failed", "Evicted", message
        await self._report(running, state)

    # ------------------------------------------------------------------------------ the watch
    async def _watch(self) -> None:
        while True:
            try:
                await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # the node must keep serving the pods it runs
                log.exception("node pass failed")
            await asyncio.sleep(self.poll_seconds)

    async def _pass(self) -> None:
        pods = (await self.emulator.call("GET", "api/v1/pods"))["items"]
        self._services = (await self.emulator.call("GET", "api/v1/services"))["items"]
        if self.scheduler is not None:
            pods = await self.scheduler.bind(pods)
        seen: set[str] = set()
        records = [r for p in pods if (r := dns.record_of(p)) is not None]
        for pod in pods:
            meta = pod["metadata"]
            uid = meta.get("uid")
            if not uid:
                await self._patch_meta(pod, {"uid": str(uuid.uuid4())})  # the API server's job
                continue
            if (pod.get("spec") or {}).get("nodeName") != self.info.name:
                continue
            seen.add(uid)
            running = self.pods.get(uid)
            if meta.get("deletionTimestamp"):
                if uid not in self._deleting and FINALIZER in (meta.get("finalizers") or []):
                    self._deleting.add(uid)
                    self._spawn(self._delete(pod, running))
                continue
            if running is None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                await self._admit(pod)
        for uid, running in self.pods.items():
            # Gone without passing through graceful deletion (deleted before the node admitted it):
            # nothing of it may keep running.
            if uid not in seen and uid not in self._deleting and not running.task.done():
                self._deleting.add(uid)
                self._spawn(running.runner.stop(grace=0))
        self._records = records
        self._refresh_zone()

    def _refresh_zone(self) -> None:
        fresh = dns.zone(self._records, self._services)
        self._zone.clear()  # the DNS server holds this dict's lookup
        self._zone.update(fresh)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _patch_meta(self, pod: Mapping[str, Any], meta: dict[str, Any]) -> None:
        ns, name = pod["metadata"].get("namespace") or "default", pod["metadata"]["name"]
        await self.emulator.call(
            "PATCH", f"api/v1/namespaces/{ns}/pods/{name}", {"metadata": meta}, "application/merge-patch+json"
        )

    async def _admit(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta["uid"]
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        await self._patch_meta(pod, {"finalizers": finalizers})
        pod_dir = self.dir / ns / f"{name}-{uid[:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(pod_dir, 0o755)
        lookup = await self._lookup(ns)
        net = await asyncio.to_thread(self.bridge.attach)
        hosts, resolv = pod_dir / "hosts", pod_dir / "resolv.conf"
        hosts.write_text(dns.hosts_file(dns.record_of({**pod, "status": {"podIP": net.ip}})))
        resolv.write_text(dns.resolv_conf(ns, self.bridge.gateway))
        for path in (hosts, resolv):
            os.chmod(path, 0o644)
        runner = PodRunner(
            pod, net, self.bridge.gateway, pod_dir, {"/etc/hosts": hosts, "/etc/resolv.conf": resolv},
            lookup, self.settings,
            report=lambda state: self._report(self.pods[uid], state), mountpoint=self._mountpoint,
        )  # fmt: skip
        task = asyncio.create_task(runner.run())
        self.pods[uid] = RunningPod(key=(ns, name), uid=uid, runner=runner, task=task)

    async def _lookup(self, namespace: str) -> Any:
        """The namespace's Secrets and ConfigMaps as they are when the pod starts."""
        objects: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, plural in (("Secret", "secrets"), ("ConfigMap", "configmaps")):
            listed = await self.emulator.call("GET", f"api/v1/namespaces/{namespace}/{plural}")
            for obj in (listed or {}).get("items") or []:
                objects[(kind, obj["metadata"]["name"])] = obj
        return lambda kind, name: objects.get((kind, name))

    async def _delete(self, pod: Mapping[str, Any], running: RunningPod | None) -> None:
        """Graceful deletion: stop the pod's processes, write how they ended, let the object go."""
        if running is not None:
            await running.runner.stop()
            await asyncio.wait({running.task}, timeout=30)
            await self._report(running, running.runner.state)
            await asyncio.to_thread(self.bridge.detach, running.runner.net)
        finalizers = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(AssertionError):
            await self._patch_meta(pod, {"finalizers": finalizers})

    async def _report(self, running: RunningPod, state: PodState) -> None:
        ns, name = running.key
        status = pod_status(state)
        status["qosClass"] = qos_class(running.runner.pod)
        async with running.lock:
            with contextlib.suppress(AssertionError):  # the pod may be gone already
                await self.emulator.call(
                    "PATCH", f"api/v1/namespaces/{ns}/pods/{name}/status", {"status": status},
                    "application/merge-patch+json",
                )  # fmt: skip

    def _mountpoint(self, target: str, is_file: bool) -> None:
        """Create a mountPath missing on the host (removed again when the node closes)."""
        path = Path(target)
        missing = []
        probe = path if not is_file else path.parent
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o755)
                self._made.append(folder)
        if is_file and not path.exists():
            path.touch()
            self._made.append(path)
        if not is_file and (path in self._made or _harness_made(path)):
            # A marker keeps the folder from being removed (so its mounts detached in every pod) by
            # another node that made it too and closes first: rmdir refuses a folder that is not empty.
            marker = path / f"{MARKER}{os.getpid()}-{id(self)}"
            marker.touch()
            self._made.append(marker)


MARKER = ".dverl-node-harness-"


def _harness_made(folder: Path) -> bool:
    """A folder only nodes' markers are in (made by another node for its mountpoints)."""
    with contextlib.suppress(OSError):
        names = [entry.name for entry in folder.iterdir()]
        return bool(names) and all(name.startswith(MARKER) for name in names)
    return False


USERS = Path("/run/dverl-node-harness")
"""One file per process running nodes (named by its pid). The mountpoints a node makes on the host
(`/etc/dverl`, `/opt/dverl/examples`, ...) are shared by every node on the machine, and removing one
detaches the mounts made on it in every pod's namespace, so they are left in place while another
process's nodes may still be using them."""


_OPEN: set[int] = set()
"""This process's nodes now open: its pid file goes with the last."""


def _others_running() -> bool:
    for entry in USERS.glob("*") if USERS.is_dir() else ():
        if entry.name == str(os.getpid()):
            continue
        try:
            os.kill(int(entry.name), 0)
            return True
        except (ValueError, ProcessLookupError):
            with contextlib.suppress(OSError):
                entry.unlink()
        except PermissionError:
            return True
    return False


def _waiting(pod: Mapping[str, Any]) -> bool:
    """Not yet bound, not going away, not finished, and named by the API server (it has a uid)."""
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    return bool(
        not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and pod_phase(pod) not in ("Succeeded", "Failed")
        and meta.get("uid")
    )


class Scheduler:
    """Binds each pending pod to one of `nodes` (scheduling.choose), or marks it Unschedulable with the
    scheduler's message; pods behind scheduling gates wait (SchedulingGated); the pods of a PodGroup are
    placed all together or not at all (gangs.py), before the pods of no gang."""

    def __init__(self, emulator: Any, nodes: Sequence[Node]) -> None:
        self.emulator = emulator
        self.nodes = list(nodes)
        self._said: dict[str, str] = {}
        self._gang_since: dict[gangs.GangKey, float] = {}

    async def bind(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pods, those bound in this pass with their node."""
        infos = [n.info for n in self.nodes]
        bound: dict[str, list[dict[str, Any]]] = {i.name: [] for i in infos}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node in bound:
                bound[node].append(pod)
        decided = await self._place_gangs(pods, bound, infos)
        out = []
        for pod in pods:
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            if not _waiting(pod):
                out.append(pod)
                continue
            if spec.get("schedulingGates"):
                await self._unscheduled(
                    pod, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
                )
                out.append(pod)
                continue
            if meta["uid"] in decided:
                node, message = decided[meta["uid"]]
            else:
                node, message = choose(pod, infos, bound)
            if node is None:
                if message is not None:
                    await self._unscheduled(pod, "Unschedulable", message)
                out.append(pod)
                continue
            ns = meta.get("namespace") or "default"
            with contextlib.suppress(AssertionError):  # gone meanwhile
                await self.emulator.call(
                    "PATCH", f"api/v1/namespaces/{ns}/pods/{meta['name']}", {"spec": {"nodeName": node}},
                    "application/merge-patch+json",
                )  # fmt: skip
            pod = {**pod, "spec": {**spec, "nodeName": node}}
            if meta["uid"] not in decided:
                bound[node].append(pod)
            out.append(pod)
        return out

    async def _place_gangs(
        self, pods: list[dict[str, Any]], bound: dict[str, list[dict[str, Any]]], infos: list[NodeInfo]
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each waiting gang member's (node, message), its gang placed whole or not at all; the nodes the
        placed ones go to are taken in `bound` before any other pod is placed."""
        members: dict[gangs.GangKey, list[dict[str, Any]]] = {}
        live: dict[gangs.GangKey, int] = {}
        for pod in pods:
            key = gangs.gang_of(pod)
            if key is None or not pod["metadata"].get("uid"):
                continue
            if pod_phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                live[key] = live.get(key, 0) + 1
            if _waiting(pod) and not (pod.get("spec") or {}).get("schedulingGates"):
                members.setdefault(key, []).append(pod)
        decided: dict[str, tuple[str | None, str | None]] = {}
        for key, waiting in members.items():
            group = await self.emulator.call("GET", gangs.group_path(key))
            since = self._gang_since.setdefault(key, time.monotonic())
            placement = gangs.place(
                key, group, waiting, live.get(key, 0), bound,
                lambda pod, trial: choose(pod, infos, trial), time.monotonic() - since,
            )  # fmt: skip
            if placement.nodes:
                self._gang_since.pop(key, None)
            for pod in waiting:
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                node = placement.nodes.get(name)
                decided[uid] = (node, None if node else placement.unplaced.get(name))
                if node is not None:
                    bound[node].append({**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}})
        return decided

    async def _unscheduled(self, pod: dict[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        if self._said.get(meta["uid"]) == message:
            return
        self._said[meta["uid"]] = message
        condition = {
            "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
            "lastTransitionTime": stamp(),
        }  # fmt: skip
        ns = meta.get("namespace") or "default"
        with contextlib.suppress(AssertionError):
            await self.emulator.call(
                "PATCH", f"api/v1/namespaces/{ns}/pods/{meta['name']}/status",
                {"status": {"phase": "Pending", "conditions": [condition]}}, "application/merge-patch+json",
            )  # fmt: skip


@contextlib.asynccontextmanager
async def nodes(
    emulator: Any, tmp: Path, infos: Sequence[NodeInfo], **options: Any
) -> AsyncIterator[list[Node]]:
    """Several nodes, each on its own bridge, joined by a router, with one scheduler over them all (run by
    the first node)."""
    made = [Node(emulator, tmp, info=info, schedules=False, **options) for info in infos]
    made[0].scheduler = Scheduler(emulator, made)
    router = Router()
    async with contextlib.AsyncExitStack() as stack:
        opened = []
        for node in made:
            stack.callback(node.bridge.close)  # also when a later step fails before the node is entered
            await asyncio.to_thread(node.bridge.open)
            opened.append(node.bridge)
        await asyncio.to_thread(router.open, opened)
        stack.callback(router.close)
        for node in made:
            await stack.enter_async_context(node)
        yield made
