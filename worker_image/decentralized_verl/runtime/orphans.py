"""Nothing a killed process started outlives it.

A process that starts helper daemons it does not spawn itself (hivemind's DHT process and its `p2pd`, which
holds the DHT port) cannot tie them to its own life: `kill -9` runs no cleanup, and those daemons are not
its direct children. `guard_descendants()` starts a small watchdog process that, once the guarded process is
gone, kills whatever it started: every descendant it saw while polling, and every process that carries the
guard's mark in its environment (`DVERL_GUARDED_BY`, set in the guarded process before the watchdog starts,
so every process it starts afterwards inherits it), and every process of the owner's own process group when
it leads one. The mark and the group cover what polling can miss: a daemon started between two polls, or
one already re-parented when the owner died (hivemind's forked DHT process and p2pd under a loaded
machine). Process identity is (pid, start time), so a reused pid is never killed. Linux only
(reads /proc); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from decentralized_verl.settings import env_name

POLL_S = 0.5
PARENT_VARIABLE = env_name("die_with_parent")
"""Set by a launcher to its pid: the child asks the kernel for SIGTERM when that parent dies."""
_PR_SET_PDEATHSIG = 1
MARK_VARIABLE = env_name("guarded_by")
"""`pid:start` of every guard above a process, comma-separated (guards nest: `dverl run`, then a worker).
A guard reads and extends it in the environment its process's children inherit, so it is read there, at
the moment the guard starts, not from the settings the process started with."""
_started_for: int | None = None


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 onwards: state, ppid, pgrp, ...), None if
    the process is gone. The name is cut at its last ")" since it may hold spaces and parentheses."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22), None if gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _pgrp(pid: int) -> int | None:
    """The process group of `pid` (field 5), None if gone."""
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def in_group(group: int) -> set[int]:
    """Every living process of process group `group`."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pgrp(int(entry.name)) == group:
            found.add(int(entry.name))
    return found


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry.name)):
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


def marked(mark: str) -> set[int]:
    """Processes whose environment carries `mark` among its guards (this user's processes; others are not
    readable and were not started by the guarded process anyway)."""
    needle = f"{MARK_VARIABLE}=".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for variable in environ.split(b"\0"):
            guards = variable[len(needle) :].decode(errors="replace").split(",")
            if variable.startswith(needle) and mark in guards:
                found.add(int(entry.name))
    return found


def watch(owner: int, owner_started: int, owner_group: int | None = None) -> None:
    """The watchdog's loop: remember the owner's descendants; when the owner is gone, kill them and every
    process marked with the owner's guard."""
    me = os.getpid()
    seen: dict[int, int] = {}
    # An owner that leads its own process group (`dverl run`, a launcher's child) shares that group with
    # every process it forked without exec (hivemind's DHT process): those neither show the guard's mark
    # in /proc/PID/environ (it is the environment of their last exec) nor stay its descendants once it
    # dies, so a poll that missed them would leave them. They stay in its group.
    group = owner if owner_group == owner else None
    while _start_time(owner) == owner_started:
        for pid in descendants(owner) - {me}:
            started = _start_time(pid)
            if started is not None:
                seen[pid] = started
        time.sleep(POLL_S)
    for pid in marked(f"{owner}:{owner_started}") - {me} - set(seen):
        started = _start_time(pid)
        if started is not None:
            seen[pid] = started
    for pid in (in_group(group) if group is not None else set()) - {me} - set(seen):
        started = _start_time(pid)
        if started is not None and started >= owner_started:  # never one older than the owner
            seen[pid] = started
    for pid, started in seen.items():
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def die_with_parent(expected: int | None) -> None:
    """Honour the launcher's request (`expected`, its pid from PARENT_VARIABLE): SIGTERM to this process
    when that parent dies.

    Done here, in the child, rather than in a `preexec_fn` between fork and exec, which is unsafe in a
    parent that runs threads. The variable is removed so this process's own children do not inherit it;
    a parent already gone by now (the kernel then would never signal) ends this process at once.
    """
    os.environ.pop(PARENT_VARIABLE, None)
    if not expected or not Path("/proc/self/stat").exists():
        return
    import ctypes  # noqa: PLC0415 light: ctypes, for a process started to die with its launcher only

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != expected:
        os.kill(os.getpid(), signal.SIGTERM)


def guard_descendants() -> subprocess.Popen | None:
    """Start the watchdog for this process (once per process; a no-op without /proc)."""
    global _started_for
    me = os.getpid()
    started = _start_time(me)
    if started is None or _started_for == me:
        return None
    _started_for = me
    mark = f"{me}:{started}"
    above = os.environ.get(MARK_VARIABLE)
    os.environ[MARK_VARIABLE] = f"{above},{mark}" if above else mark  # inherited by all it starts from now
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "decentralized_verl.runtime.orphans",
            str(me),
            str(started),
            str(os.getpgrp()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the guarded process's group does not stop its guard
        close_fds=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
