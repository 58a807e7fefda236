"""Nothing a killed process started outlives it.

A process that starts helper daemons it does not spawn itself (hivemind's DHT process and its `p2pd`, which
holds the DHT port) cannot tie them to its own life: `kill -9` runs no cleanup, and those daemons are not
its direct children. `guard_descendants()` starts a small watchdog process that notes every descendant of
the guarded process while it lives and, once it is gone, kills whatever of them is left. Process identity
is (pid, start time), so a reused pid is never killed. Linux only (reads /proc); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
_started_for: int | None = None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = int(fields[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every living process below `pid` in the process tree."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def watch(owner: int, owner_started: int) -> None:
    """The watchdog's loop: remember the owner's descendants; when the owner is gone, kill them."""
    me = os.getpid()
    seen: dict[int, int] = {}
    while _start_time(owner) == owner_started:
        for pid in descendants(owner) - {me}:
            started = _start_time(pid)
            if started is not None:
                seen[pid] = started
        time.sleep(POLL_S)
    for pid, started in seen.items():
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def guard_descendants() -> subprocess.Popen | None:
    """Start the watchdog for this process (once per process; a no-op without /proc)."""
    global _started_for
    me = os.getpid()
    started = _start_time(me)
    if started is None or _started_for == me:
        return None
    _started_for = me
    return subprocess.Popen(
        [sys.executable, "-m", "decentralized_verl.orphans", str(me), str(started)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the guarded process's group does not stop its guard
        close_fds=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
