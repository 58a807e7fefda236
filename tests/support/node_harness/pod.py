"""One pod run for real: its init containers in order, then its containers, each a process in the pod's
network namespace and a private mount and UTS namespace of its own, as the container's user, in a memory
cgroup holding it to its memory limit (over it, the kernel kills it and the node reports OOMKilled),
restarted as restartPolicy says (with the kubelet's back-off, shortened for tests), probed as its
readiness and liveness probes say (probes.py: a failed liveness probe restarts it); stopped with SIGTERM,
then SIGKILL for the whole process group after the grace period.

Every change of state is handed to `report` (the node writes it to the pod's status).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dverl_operator.objects.quantity import parse as parse_quantity
from tests.support.node_harness import cgroups, probes
from tests.support.node_harness import mounts as mnt
from tests.support.node_harness.env import EnvError, container_env
from tests.support.node_harness.image import ImageStandIn, resolve_argv
from tests.support.node_harness.netns import PodNetwork
from tests.support.node_harness.status import (
    ContainerState,
    PodState,
    exit_code_of,
    phase_of,
    termination_message,
)

UNSHARE = "/usr/bin/unshare"
SETPRIV = "/usr/bin/setpriv"
IP = "/usr/sbin/ip"


@dataclass(frozen=True)
class Identity:
    """Who the container's process runs as: the image's USER unless the pod or container says otherwise;
    fsGroup and supplementalGroups join its groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    no_new_privs: bool
    drop_all: bool


def identity_of(pod: Mapping[str, Any], container: Mapping[str, Any], image: ImageStandIn) -> Identity:
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser", image.user))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", image.group if uid == image.user else 0))
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and uid == 0:
        raise EnvError("container has runAsNonRoot and would run as root (CreateContainerConfigError)")
    groups = [g for g in (pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])) if g is not None]
    drop = [str(c).upper() for c in ((sc.get("capabilities") or {}).get("drop") or [])]
    return Identity(
        uid=int(uid),
        gid=int(gid),
        groups=tuple(int(g) for g in groups),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
        drop_all="ALL" in drop,
    )


def user_wrapper(who: Identity) -> list[str]:
    """setpriv's arguments to become the container's user before exec."""
    argv = [SETPRIV]
    if who.uid != 0 or who.gid != 0 or who.groups:
        argv += [f"--reuid={who.uid}", f"--regid={who.gid}"]
        argv += [f"--groups={','.join(map(str, who.groups))}"] if who.groups else ["--clear-groups"]
    if who.no_new_privs:
        argv.append("--no-new-privs")
    if who.drop_all:
        argv += ["--inh-caps=-all", "--bounding-set=-all"]
    return [*argv, "--"]


@dataclass
class Settings:
    """How the node plays the kubelet: the images it holds, the claims it can bind, the API server address
    pods see, and the crash-loop back-off (10 s doubling to 5 min in a kubelet; short here)."""

    images: Mapping[str, ImageStandIn]
    """The image names this node can pull, each with the stand-in a container of it runs in (image.py
    `node_images`); any other waits ImagePullBackOff."""
    claims: Mapping[str, Path]
    api_server: tuple[str, int] | None = None
    backoff: tuple[float, float] = (0.5, 4.0)
    memory: cgroups.Hierarchy | None = None
    """Where containers' memory cgroups are made (None: memory limits are not enforced)."""
    readiness_time_scale: float = 0.1
    device_env: Callable[[Mapping[str, Any]], Mapping[str, str]] = lambda container: {}
    """What the node adds to a container's env in a device plugin's stead (gpus.py `device_env`)."""
    """Readiness probes' periods and initial delays are multiplied by this (a 10 s period is 1 s here), so
    pods become ready soon after they can; liveness probes run on the pod's own clock, since a liveness
    failure kills. Thresholds and timeouts are always as the pod states them."""


class PodRunner:
    def __init__(
        self,
        pod: Mapping[str, Any],
        net: PodNetwork,
        gateway: str,
        pod_dir: Path,
        etc_files: Mapping[str, Path],
        lookup: mnt.Lookup,
        settings: Settings,
        report: Callable[[PodState], Awaitable[None]],
        mountpoint: Callable[[str, bool], None],
    ) -> None:
        self.pod = pod
        self.net = net
        self.pod_dir = pod_dir
        self.etc_files = etc_files
        self.lookup = lookup
        self.settings = settings
        self.report = report
        self.mountpoint = mountpoint
        spec = pod.get("spec") or {}
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.state = PodState(
            init=[ContainerState(c["name"], c.get("image", "")) for c in spec.get("initContainers") or []],
            main=[ContainerState(c["name"], c.get("image", "")) for c in spec.get("containers") or []],
            pod_ip=net.ip,
            host_ip=gateway,
        )
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.stopping = False
        self.logs: dict[str, Path] = {}

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    async def run(self) -> PodState:
        """Until every container is done for good, or `stop` is called."""
        self.state.start_time = time.time()
        await self.report(self.state)
        spec = self.pod.get("spec") or {}
        for index, container in enumerate(spec.get("initContainers") or []):
            if not await self._init(container, self.state.init[index]):
                self.state.phase = "Failed"
                await self.report(self.state)
                return self.state
        self.state.initialized = True
        await asyncio.gather(
            *(self._keep(c, self.state.main[i]) for i, c in enumerate(spec.get("containers") or []))
        )
        self._settle()
        await self.report(self.state)
        return self.state

    def _settle(self) -> None:
        """No container restarts any more: the phase from how they ended (an eviction keeps Failed)."""
        if self.state.disruption is None:
            self.state.phase = phase_of(self.state.main, "Never", self.state.initialized, False)

    async def _init(self, container: Mapping[str, Any], cs: ContainerState) -> bool:
        """An init container runs to success before the next; retried unless restartPolicy is Never."""
        while not self.stopping:
            code = await self._run_once(container, cs)
            if code == 0:
                return True
            if code is None or self.restart_policy == "Never" or self.stopping:
                return False
            await self._back_off(cs)
        return False

    async def _keep(self, container: Mapping[str, Any], cs: ContainerState) -> None:
        while not self.stopping:
            code = await self._run_once(container, cs)
            if code is None or self.stopping:
                return
            if self.restart_policy == "Never" or (self.restart_policy == "OnFailure" and code == 0):
                return
            await self._back_off(cs)

    async def _back_off(self, cs: ContainerState) -> None:
        base, cap = self.settings.backoff
        delay = min(base * 2**cs.restart_count, cap)
        cs.waiting("CrashLoopBackOff", f"back-off {delay:.1f}s restarting failed container={cs.name}")
        self.state.phase = phase_of(self.state.main, self.restart_policy, self.state.initialized, False)
        await self.report(self.state)
        await asyncio.sleep(delay)

    def argv_and_env(self, container: Mapping[str, Any]) -> tuple[list[str], dict[str, str], list[mnt.Mount]]:
        """What one start of the container runs (raises EnvError/VolumeError/FileNotFoundError as the
        kubelet's CreateContainerConfigError / FailedMount / StartError)."""
        image = self.image_of(container)
        env = {
            **image.env(),
            **container_env(self.pod, container, self.net.ip, self.lookup, self.settings.api_server),
            **self.settings.device_env(container),
        }
        argv = resolve_argv(container, image, env)
        mounts = mnt.prepare(self.pod, container, self.pod_dir, self.lookup, self.settings.claims)
        return argv, env, mounts

    def image_of(self, container: Mapping[str, Any]) -> ImageStandIn:
        """The stand-in that plays the container's image (pulled: the node holds it)."""
        return self.settings.images[str(container.get("image") or "")]

    async def _pull(self, container: Mapping[str, Any], cs: ContainerState) -> bool:
        """The kubelet's image pull: an image the node cannot get leaves the container waiting,
        ErrImagePull after each try and ImagePullBackOff between tries (doubling), until the pod goes.
        False when the pod stopped before the image came."""
        name = str(container.get("image") or "")
        tries = 0
        while name not in self.settings.images:
            if self.stopping:
                return False
            cs.waiting(
                "ErrImagePull",
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{name}": failed to '
                f'resolve reference "{name}": {name}: not found',
            )
            await self.report(self.state)
            base, cap = self.settings.backoff
            await asyncio.sleep(base)
            cs.waiting("ImagePullBackOff", f'Back-off pulling image "{name}"')
            await self.report(self.state)
            await asyncio.sleep(min(base * 2**tries, cap))
            tries += 1
        return True

    async def _run_once(self, container: Mapping[str, Any], cs: ContainerState) -> int | None:
        """One start of the container; its exit code, or None when it could not start."""
        if not await self._pull(container, cs):
            return None
        image = self.image_of(container)
        try:
            who = identity_of(self.pod, container, image)
            argv, env, mounts = self.argv_and_env(container)
        except (EnvError, mnt.VolumeError, FileNotFoundError, ValueError) as exc:
            reason = (
                "CreateContainerError" if isinstance(exc, FileNotFoundError) else "CreateContainerConfigError"
            )
            cs.waiting(reason, str(exc))
            self.state.message = str(exc)
            await self.report(self.state)
            return None
        memory_cgroup = self._memory_cgroup(container)
        start = cs.restart_count + (cs.started_at is not None)
        layer = self.pod_dir / "rootfs" / f"{cs.name}.{start}"
        layer.mkdir(parents=True, exist_ok=True)
        os.chown(layer, who.uid, who.gid)
        # The kubelet binds a fresh file at terminationMessagePath for the container to explain its end.
        said = self.pod_dir / "termination" / f"{cs.name}.{start}"
        said.parent.mkdir(parents=True, exist_ok=True)
        said.write_bytes(b"")
        os.chmod(said, 0o666)
        message_path = container.get("terminationMessagePath") or "/dev/termination-log"
        mounts = [*mounts, mnt.Mount(target=message_path, source=said)]
        baked = [mnt.Mount(target=t, source=s, read_only=True) for t, s in image.files.items()]
        mounts = [*baked, *mounts]  # the image's own files first: a volume mounted over them wins
        for target, is_file in mnt.mountpoints(mounts, image.workdir):
            self.mountpoint(target, is_file)
        read_only_root = bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        script = mnt.mount_script(
            mounts,
            self.etc_files,
            self._hostname(),
            layer,
            image.workdir,
            read_only_root,
            reachable=mnt.blocked_ancestors(image.code_paths()) if who.uid != 0 else None,
            image_paths=[Path(os.path.realpath(p)) for p in image.code_paths()[1:]],
        )
        enter = cgroups.enter_command(memory_cgroup.procs) if memory_cgroup is not None else []
        wrapped = [
            *enter, IP, "netns", "exec", self.net.namespace,
            UNSHARE, "--mount", "--uts", "--propagation", "private", "--",
            "/bin/bash", "-c", script, "bash", *user_wrapper(who), *argv,
        ]  # fmt: skip
        log_path = self.pod_dir / "logs" / f"{cs.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.logs[cs.name] = log_path
        with open(log_path, "ab") as log:
            log.write(f"--- start {cs.restart_count}: {' '.join(argv)}\n".encode())
            log.flush()
            offset = log.tell()
            process = await asyncio.create_subprocess_exec(
                *wrapped, stdout=log, stderr=log, env=env, start_new_session=True
            )
        self.processes[cs.name] = process
        cs.started(time.time())
        self.state.phase = "Running" if self.state.initialized else "Pending"
        watch = probes.ContainerProbes(
            container, cs, process, self.net.ip, env, self.settings.readiness_time_scale, self.report_state,
            kill=lambda: self._liveness_kill(process),
        )  # fmt: skip
        probing = asyncio.create_task(watch.run())
        await self.report(self.state)
        try:
            returncode = await process.wait()
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
            self._kill_group(process)
            oom_killed = memory_cgroup is not None and memory_cgroup.oom_kills() > 0
            if memory_cgroup is not None:
                await asyncio.to_thread(memory_cgroup.remove)
        code = exit_code_of(returncode)
        with open(log_path, "rb") as log:
            log.seek(offset)
            tail = log.read()
        policy = container.get("terminationMessagePolicy") or "File"
        reason = "OOMKilled" if oom_killed and code == 137 else ""
        cs.exited(code, time.time(), termination_message(said.read_bytes(), tail, policy, code), reason)
        self.state.phase = phase_of(self.state.main, self.restart_policy, self.state.initialized, False)
        await self.report(self.state)
        return cs.exit_code

    async def report_state(self) -> None:
        await self.report(self.state)

    def _memory_cgroup(self, container: Mapping[str, Any]) -> cgroups.MemoryCgroup | None:
        """The container's own memory cgroup at its memory limit (None when it has none, or the node does
        not enforce limits)."""
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if limit is None or self.settings.memory is None:
            return None
        return cgroups.MemoryCgroup.make(self.settings.memory, int(parse_quantity(str(limit))))

    async def _liveness_kill(self, process: asyncio.subprocess.Process) -> None:
        """What the kubelet does to a container whose liveness probe failed: SIGTERM, then SIGKILL after
        the grace period; restartPolicy then restarts it."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), self.grace)
        except TimeoutError:
            self._kill_group(process)

    def _hostname(self) -> str:
        spec = self.pod.get("spec") or {}
        return spec.get("hostname") or self.name

    async def stop(self, grace: float | None = None) -> None:
        """SIGTERM to each container's process, SIGKILL to its whole group once the grace period is over."""
        self.stopping = True
        grace = self.grace if grace is None else grace
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if running:
            _, late = await asyncio.wait([asyncio.create_task(p.wait()) for p in running], timeout=grace)
            for process in running:
                if process.returncode is None:
                    self._kill_group(process)
            if late:
                await asyncio.wait(late, timeout=10)

    def pause(self) -> None:
        """SIGSTOP to each running container's whole process group (the cgroup freezer's effect)."""
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGCONT)

    def _kill_group(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def kill_now(self) -> None:
        """Teardown: nothing of the pod may outlive the test."""
        self.stopping = True
        for process in self.processes.values():
            self._kill_group(process)
