"""Pure: why an exited pod failed, in one line a person can act on, and which kind of failure it is.

A container that fails says why in its termination message (a source fetcher names the URL and what went
wrong there; the worker's last log lines with FallbackToLogsOnError), so the job's WorkerFailed event
carries it instead of a bare "Failed".

Failures come in kinds, as Kubernetes' and JobSet's pod failure policies tell them apart: a worker that
exits with the runtime's bad-input code (the CLI's exit 2: a manifest, data file or model a person must
fix) fails the same way on every retry, a container the kernel killed for memory will be killed
again under the same limit (the worker's own memory estimate, left in its termination message, says by
how much), and a learner whose weight refresh failed its refit-parity check (exit 3:
the rollout's log-probs are not the learner's) would refresh the same way from its checkpoint; all three
end the job at once. Only the rest (crashes, lost peers, a node's
trouble) is worth retrying.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from decentralized_verl.core.memory_report import MemoryEstimate, read_estimate
from decentralized_verl.errors import EXIT_REFIT_PARITY, EXIT_USAGE
from dverl_operator.objects import quoting

REFIT_MESSAGE_CHARS = 1000
"""A refit-parity verdict names the rollout workers, the learner and the version: kept whole."""
BAD_INPUT_EXIT = EXIT_USAGE
"""The exit code every `dverl` process ends with for input a person must fix (errors.py)."""
OOM_REASON = "OOMKilled"

Kind = Literal["bad-input", "oom", "refit-parity", "other"]


@dataclass(frozen=True)
class Ending:
    """How a failed pod ended: its kind and the container that decided it (None: the pod as a whole)."""

    kind: Kind
    container: str | None = None
    exit_code: int | None = None
    message: str = ""
    estimate: MemoryEstimate | None = None
    """The worker's own memory estimate, when its termination message still held it (it was killed
    before it could clear it: core/memory_report.py); never quoted as the message."""


def _failed_containers(status: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, terminated state) of each container that exited non-zero, init containers first: the
    worker never ran after one of them failed."""
    found = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            ended = ((container.get("state") or {}).get("terminated")) or {}
            if ended.get("exitCode") not in (None, 0):
                found.append((str(container.get("name")), ended))
    return found


def ending(pod: Mapping[str, Any]) -> Ending:
    """The kind of a failed pod's end, from its first failed container."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return Ending("other", message=str(status["reason"]))
    for name, ended in _failed_containers(status)[:1]:
        code = int(ended["exitCode"])
        estimate = read_estimate(str(ended.get("message") or ""))
        said = "" if estimate is not None else " ".join(str(ended.get("message") or "").split())
        message = quoting.tail(said)
        if ended.get("reason") == OOM_REASON:
            return Ending("oom", name, code, message, estimate)
        if code == EXIT_REFIT_PARITY:
            return Ending("refit-parity", name, code, said[:REFIT_MESSAGE_CHARS])
        if code == BAD_INPUT_EXIT:
            return Ending("bad-input", name, code, message)
        return Ending("other", name, code, message)
    return Ending("other")


def failure_reason(pod: Mapping[str, Any]) -> str:
    """The pod's reason (Evicted, DeadlineExceeded, ...), else its first failed container's exit and
    message, else its phase."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return str(status["reason"])
    for name, ended in _failed_containers(status)[:1]:
        said = str(ended.get("message") or "")
        if read_estimate(said) is not None:  # a memory estimate the worker left, not why it ended
            said = ""
        message = " ".join(str(said or ended.get("reason") or "").split())
        line = f"container {name} exited {ended['exitCode']}"
        return f"{line}: {quoting.tail(message)}" if message else line
    return str(status.get("phase") or "Unknown")


def memory_limit(pod: Mapping[str, Any], container: str | None) -> str | None:
    """The memory limit the named container ran under (None: none was set)."""
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for item in spec.get(key) or []:
            if item.get("name") == container:
                return ((item.get("resources") or {}).get("limits") or {}).get("memory")
    return None
