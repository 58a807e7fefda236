"""A container's readiness and liveness probes as the kubelet runs them: httpGet (a 2xx or 3xx answer),
tcpSocket (a connection) or exec (exit 0, run inside the container's namespaces as its user), every
`periodSeconds` after `initialDelaySeconds`, each try given `timeoutSeconds`; `successThreshold`
consecutive successes make it pass, `failureThreshold` consecutive failures make it fail. Readiness sets
the container's `ready` (no readiness probe: ready once started); a failed liveness probe kills the
container, which restartPolicy then restarts (restartCount moves).

Readiness periods and delays are scaled by the node's `readiness_time_scale` so pods become ready soon
after they can; liveness runs on the pod's own clock. Thresholds and timeouts are as stated.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.node_harness.status import ContainerState

NSENTER = "/usr/bin/nsenter"


@dataclass(frozen=True)
class ProbeSpec:
    kind: str
    """httpGet | tcpSocket | exec"""
    action: Mapping[str, Any]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int


def probe_spec(probe: Mapping[str, Any] | None) -> ProbeSpec | None:
    if not probe:
        return None
    kind = next((k for k in ("httpGet", "tcpSocket", "exec", "grpc") if k in probe), None)
    if kind is None:
        return None
    return ProbeSpec(
        kind=kind,
        action=probe[kind],
        initial_delay=float(probe.get("initialDelaySeconds", 0)),
        period=float(probe.get("periodSeconds", 10)),
        timeout=float(probe.get("timeoutSeconds", 1)),
        success_threshold=int(probe.get("successThreshold", 1)),
        failure_threshold=int(probe.get("failureThreshold", 3)),
    )


def port_of(container: Mapping[str, Any], port: Any) -> int | None:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, str) and not port.isdigit():
        return next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
    return int(port) if port is not None else None


def _tcp(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _http(url: str, headers: Mapping[str, str], timeout: float) -> bool:
    request = urllib.request.Request(url, headers=dict(headers))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return 200 <= answer.status < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400
    except (OSError, ValueError):
        return False


def _ids(pid: int) -> tuple[str, str]:
    """The uid and gid the container's process runs as now (it became the container's user by exec)."""
    ids = {"Uid": "0", "Gid": "0"}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ids:
                ids[key] = value.split()[0]
    return ids["Uid"], ids["Gid"]


class ContainerProbes:
    """The probes of one start of a container, run until its process ends."""

    def __init__(
        self,
        container: Mapping[str, Any],
        cs: ContainerState,
        process: asyncio.subprocess.Process,
        pod_ip: str,
        env: Mapping[str, str],
        readiness_scale: float,
        report: Callable[[], Awaitable[None]],
        kill: Callable[[], Awaitable[None]],
    ) -> None:
        self.container = container
        self.cs = cs
        self.process = process
        self.pod_ip = pod_ip
        self.env = dict(env)
        self.readiness_scale = readiness_scale
        self.report = report
        self.kill = kill
        self.liveness_failures = 0
        """How many times liveness failed for good in this start (0 or 1: the start ends then)."""

    async def run(self) -> None:
        readiness = probe_spec(self.container.get("readinessProbe"))
        liveness = probe_spec(self.container.get("livenessProbe"))
        if readiness is None:
            self.cs.ready = True
            await self.report()
        tasks = [
            asyncio.create_task(self._loop(spec, live))
            for spec, live in ((readiness, False), (liveness, True))
            if spec
        ]
        try:
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _loop(self, spec: ProbeSpec, live: bool) -> None:
        scale = 1.0 if live else self.readiness_scale
        await asyncio.sleep(spec.initial_delay * scale)
        passes = fails = 0
        while self.process.returncode is None:
            ok = await self.check(spec)
            if self.process.returncode is not None:
                return
            passes, fails = (passes + 1, 0) if ok else (0, fails + 1)
            if live:
                if fails >= spec.failure_threshold:
                    self.liveness_failures += 1
                    self.cs.message = f"Liveness probe failed {fails} times; the container is restarted"
                    await self.kill()
                    return
            elif passes >= spec.success_threshold and not self.cs.ready:
                self.cs.ready = True
                await self.report()
            elif fails >= spec.failure_threshold and self.cs.ready:
                self.cs.ready = False
                await self.report()
            await asyncio.sleep(max(spec.period * scale, 0.05))

    async def check(self, spec: ProbeSpec) -> bool:
        action = spec.action
        if spec.kind == "tcpSocket":
            port = port_of(self.container, action.get("port"))
            host = action.get("host") or self.pod_ip
            return port is not None and await asyncio.to_thread(_tcp, host, port, spec.timeout)
        if spec.kind == "httpGet":
            port = port_of(self.container, action.get("port"))
            host = action.get("host") or self.pod_ip
            scheme = str(action.get("scheme") or "HTTP").lower()
            path = action.get("path") or "/"
            headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
            url = f"{scheme}://{host}:{port}{path}"
            return port is not None and await asyncio.to_thread(_http, url, headers, spec.timeout)
        if spec.kind == "exec":
            return await self._exec(list(action.get("command") or []), spec.timeout)
        return False

    async def _exec(self, command: list[str], timeout: float) -> bool:
        """The command in the container's namespaces (network, mount, UTS) as its first process's user."""
        if not command:
            return False
        pid = self.process.pid
        uid, gid = _ids(pid)
        argv = [NSENTER, "-t", str(pid), "-n", "-m", "-u", "-S", uid, "-G", gid, "--", *command]
        try:
            child = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=self.env
            )
        except OSError:
            return False
        try:
            return await asyncio.wait_for(child.wait(), timeout) == 0
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            return False
