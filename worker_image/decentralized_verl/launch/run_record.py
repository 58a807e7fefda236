"""Who runs a run folder, and how its run ended: `run.json`, written by `dverl run`.

`dverl status` reads a folder, never the processes; without this file it could not tell a run in
progress from one whose processes are gone (Ctrl-C, a failure, `kill -9`, a reboot) and would show the
last step forever as "running". The supervisor writes its pid (with the process's start time, so a
reused pid is not taken for it) when it starts, and the outcome when it ends; a folder whose supervisor
is gone without an outcome was interrupted.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

RECORD_FILE = "run.json"
RUNNING, FINISHED, FAILED, INTERRUPTED = "running", "finished", "failed", "interrupted"


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), None when no such process lives."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def start_record(output: Path) -> None:
    """Mark the folder as run by this process, from now."""
    pid = os.getpid()
    _write(
        output,
        {
            "state": RUNNING,
            "pid": pid,
            "pid_started": process_start_time(pid),
            "host": socket.gethostname(),
            "started": round(time.time(), 3),
        },
    )


def end_record(output: Path, state: str, detail: str = "") -> None:
    """Write how the run ended (`finished`, `failed` with why, `interrupted`)."""
    record = read_record(output) or {}
    record.update(state=state, ended=round(time.time(), 3))
    if detail:
        record["detail"] = detail[:2000]
    _write(output, record)


def read_record(output: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((output / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def supervisor_alive(record: dict[str, Any], host: str | None = None) -> bool | None:
    """Whether the process that wrote `record` still runs (None: it ran on another machine, unknown)."""
    if record.get("host") != (host or socket.gethostname()):
        return None
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    started = process_start_time(pid)
    return started is not None and started == record.get("pid_started")


def recorded_state(output: Path) -> tuple[str, str] | None:
    """(state, detail) from the folder's record: its outcome, `interrupted` when its supervisor is gone
    without writing one, `running` while it lives; None without a record or when it cannot tell."""
    record = read_record(output)
    if record is None:
        return None
    state = record.get("state")
    if state != RUNNING:
        return (str(state), str(record.get("detail", "")))
    alive = supervisor_alive(record)
    if alive is None:
        return None
    if alive:
        return (RUNNING, "")
    return (INTERRUPTED, f"its dverl run (pid {record.get('pid')}) is gone without saying how it ended")


def _write(output: Path, record: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(output / RECORD_FILE)
