"""What the kubelet reports for a pod: phase, conditions, container statuses (state, exit code, reason,
restart count, last state) and podIP. Pure builders of the `.status` the node writes through the pod's
status subresource; `phase_of` is the kubelet's rule for the pod phase from its containers and
restartPolicy.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def stamp(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))


@dataclass
class ContainerState:
    """One container as the node tracks it."""

    name: str
    image: str
    state: str = "waiting"
    """waiting | running | terminated"""
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    restart_count: int = 0
    last: dict[str, Any] | None = None
    ready: bool = False

    def started(self, at: float) -> None:
        if self.state == "terminated":
            self.last = self._terminated()
        if self.started_at is not None:  # every start after the first is a restart
            self.restart_count += 1
        self.state, self.reason, self.message, self.exit_code = "running", "", "", None
        self.started_at, self.finished_at, self.ready = at, None, False

    def exited(self, code: int, at: float, message: str = "", reason: str = "") -> None:
        self.state, self.exit_code, self.finished_at, self.ready = "terminated", code, at, False
        self.reason = reason or ("Completed" if code == 0 else "Error")
        self.message = message

    def waiting(self, reason: str, message: str = "") -> None:
        if self.state == "terminated":
            self.last = self._terminated()
        self.state, self.reason, self.message, self.ready = "waiting", reason, message, False

    def _terminated(self) -> dict[str, Any]:
        term: dict[str, Any] = {"exitCode": self.exit_code, "reason": self.reason}
        if self.started_at is not None:
            term["startedAt"] = stamp(self.started_at)
        if self.finished_at is not None:
            term["finishedAt"] = stamp(self.finished_at)
        if self.message:
            term["message"] = self.message
        return {"terminated": term}

    def to_status(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": stamp(self.started_at)}}
        elif self.state == "terminated":
            state = self._terminated()
        else:
            state = {
                "waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}
            }
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"node-harness://{self.image}",
            "ready": self.ready,
            "started": self.state == "running",
            "restartCount": self.restart_count,
            "state": state,
            "lastState": self.last or {},
        }
        return out


@dataclass
class PodState:
    """A pod as the node runs it."""

    init: list[ContainerState] = field(default_factory=list)
    main: list[ContainerState] = field(default_factory=list)
    pod_ip: str = ""
    host_ip: str = ""
    start_time: float | None = None
    initialized: bool = False
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    disruption: tuple[str, str] | None = None
    """(reason, message) of a DisruptionTarget condition (an eviction)."""


def phase_of(main: list[ContainerState], restart_policy: str, initialized: bool, init_failed: bool) -> str:
    """The kubelet's pod phase: Failed when an init container failed for good; Running while any container
    runs or will be restarted; Succeeded when all exited 0; Failed when all ended and one failed."""
    if init_failed:
        return "Failed"
    if not initialized or any(
        c.state == "waiting" and c.restart_count == 0 and c.exit_code is None for c in main
    ):
        return "Pending"
    if any(c.state == "running" for c in main):
        return "Running"
    if all(c.state == "terminated" for c in main):
        codes = [c.exit_code for c in main]
        if restart_policy == "Always" or (restart_policy == "OnFailure" and any(codes)):
            return "Running"  # restarting
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"
    return "Running"


def pod_status(state: PodState, now: float | None = None) -> dict[str, Any]:
    """The whole `.status` to merge-patch onto the pod."""
    at = stamp(now)
    ready = state.phase == "Running" and bool(state.main) and all(c.ready for c in state.main)

    def cond(kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
        c: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": at}
        if reason:
            c["reason"] = reason
        return c

    conditions = [
        cond("PodScheduled", True),
        cond("Initialized", state.initialized),
        cond("ContainersReady", ready, "" if ready else "ContainersNotReady"),
        cond("Ready", ready, "" if ready else "ContainersNotReady"),
    ]
    if state.disruption is not None:
        conditions.append(
            {**cond("DisruptionTarget", True, state.disruption[0]), "message": state.disruption[1]}
        )
    status: dict[str, Any] = {
        "phase": state.phase,
        "conditions": conditions,
        "hostIP": state.host_ip,
        "podIP": state.pod_ip,
        "podIPs": [{"ip": state.pod_ip}] if state.pod_ip else [],
        "initContainerStatuses": [c.to_status() for c in state.init],
        "containerStatuses": [c.to_status() for c in state.main],
    }
    if state.start_time is not None:
        status["startTime"] = stamp(state.start_time)
    status["reason"] = state.reason or None
    status["message"] = state.message or None
    return status


def exit_code_of(returncode: int) -> int:
    """A process killed by signal N exits 128+N in a container (137 for SIGKILL, 143 for SIGTERM)."""
    return 128 - returncode if returncode < 0 else returncode


def termination_message(written: bytes, log_tail: bytes, policy: str, code: int) -> str:
    """The kubelet's rule: what the container wrote to its terminationMessagePath (4096 bytes at most);
    with FallbackToLogsOnError and a failed container that wrote nothing, its last 80 log lines
    (2048 bytes at most)."""
    if written.strip():
        return written[:4096].decode(errors="replace")
    if policy != "FallbackToLogsOnError" or code == 0:
        return ""
    lines = log_tail.splitlines()[-80:]
    return b"\n".join(lines)[-2048:].decode(errors="replace")


def qos_class(pod: Mapping[str, Any]) -> str:
    """Guaranteed when every container's requests equal its limits (cpu and memory set), else
    Burstable when any is set, else BestEffort."""
    containers = (pod.get("spec") or {}).get("containers") or []
    set_any = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        set_any = set_any or bool(limits or requests)
        if not all(k in limits and requests.get(k, limits[k]) == limits[k] for k in ("cpu", "memory")):
            guaranteed = False
    return "Guaranteed" if guaranteed else ("Burstable" if set_any else "BestEffort")
