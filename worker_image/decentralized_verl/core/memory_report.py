"""A worker's own memory estimate, left as its container's termination message while it runs.

A container the kernel kills for memory (OOMKilled, SIGKILL) runs no code on its way out, yet the kubelet
still reads the termination-message file (`/dev/termination-log`) whatever ended the container. The
operator reads no user's model folder, so for a `model.path` or `model.package` job it cannot size a
worker itself; the worker can, once it has read its job config. So each worker writes the planner's
estimate for its own role there before it loads anything large, and the operator, seeing the pod
OOMKilled, names that figure in its fix.

The line must never stand in for a real failure: a process that ends any other way clears it, unless
something else (the learner's final progress, a refit verdict) was written over it, so that
FallbackToLogsOnError quotes the log tail as before. Outside a pod the file does not exist and nothing
is written.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from decentralized_verl.core.final_report import TERMINATION_LOG, write_termination_message

KEY = "dverlMemory"
MAX_BYTES = 1 << 60
"""An exbibyte: any figure above it is no estimate of one worker, so a line carrying one is ignored."""
MAX_LINE_CHARS = 512
"""An estimate line is short; anything longer is something else."""
_ROLE = re.compile(r"[a-z][a-z0-9-]{0,62}")


@dataclass(frozen=True)
class MemoryEstimate:
    """The planner's figures for one worker of `role`: host memory, and GPU memory when it has a GPU."""

    role: str
    host_bytes: int
    gpu_bytes: int | None = None


def estimate_line(estimate: MemoryEstimate) -> str:
    """The one JSON line a worker leaves as its termination message."""
    fields = {"role": estimate.role, "hostBytes": estimate.host_bytes, "gpuBytes": estimate.gpu_bytes}
    return json.dumps({KEY: fields}, separators=(",", ":")) + "\n"


def _byte_count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BYTES:
        return value
    return None


def read_estimate(message: str) -> MemoryEstimate | None:
    """The estimate a termination message holds, or None when it holds anything else (a log tail, a
    final report, a malformed or implausible line). Pure: the operator's reader."""
    text = message.strip()
    if not text or len(text) > MAX_LINE_CHARS or "\n" in text:
        return None
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or an integer too long to convert
        return None
    fields = document.get(KEY) if isinstance(document, dict) and len(document) == 1 else None
    if not isinstance(fields, dict):
        return None
    role = fields.get("role")
    host = _byte_count(fields.get("hostBytes"))
    gpu_given = fields.get("gpuBytes")
    gpu = _byte_count(gpu_given)
    if not isinstance(role, str) or not _ROLE.fullmatch(role) or host is None:
        return None
    if gpu_given is not None and gpu is None:
        return None
    return MemoryEstimate(role, host, gpu)


def write_estimate(estimate: MemoryEstimate, path: Path = TERMINATION_LOG) -> bool:
    """Leave the estimate where the kubelet reads the termination message; False outside a pod."""
    return write_termination_message(estimate_line(estimate), path)


def clear_estimate(path: Path = TERMINATION_LOG) -> bool:
    """Empty the termination message if it still holds an estimate (the process is ending some way other
    than a kill for memory); anything written over it stays. True when it cleared one."""
    try:
        if not path.is_file():
            return False
        with path.open(errors="replace") as said:
            if read_estimate(said.read(MAX_LINE_CHARS + 1)) is None:
                return False
        path.write_text("")
    except OSError:
        return False
    return True


def clear_on_sigterm(path: Path = TERMINATION_LOG) -> None:
    """Until the worker sets its own SIGTERM handling (a serving loop's, the learner's), a SIGTERM
    (the pod deleted while the model loads) clears the estimate, then ends the process as the default
    action would, so the kubelet falls back to the log tail."""

    def clear_then_end(signum: int, _frame: FrameType | None) -> None:
        clear_estimate(path)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, clear_then_end)
