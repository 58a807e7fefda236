"""Pure: why an exited pod failed, in one line a person can act on.

A container that fails says why in its termination message (a source fetcher names the URL and what went
wrong there; the worker's last log lines with FallbackToLogsOnError), so the job's WorkerFailed event
carries it instead of a bare "Failed".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MESSAGE_CHARS = 300


def failure_reason(pod: Mapping[str, Any]) -> str:
    """The pod's reason (Evicted, DeadlineExceeded, ...), else its first failed container's exit and
    message (init containers first: the worker never ran after one of them failed), else its phase."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return str(status["reason"])
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            ended = ((container.get("state") or {}).get("terminated")) or {}
            code = ended.get("exitCode")
            if code not in (None, 0):
                message = " ".join(str(ended.get("message") or ended.get("reason") or "").split())
                line = f"container {container.get('name')} exited {code}"
                return f"{line}: {message[:MESSAGE_CHARS]}" if message else line
    return str(status.get("phase") or "Unknown")
