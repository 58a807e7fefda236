"""A container's memory limit enforced by the kernel, as the kubelet has the runtime do: each container
start gets its own memory cgroup under this process's own (so it stays inside whatever was delegated to
us), its limit set from `resources.limits.memory` with no swap beyond it, and the container's first process
moved in before it execs. The kernel's OOM killer then kills the container when it goes over; the cgroup's
oom_kill count tells the node to report `OOMKilled` (exit 137).

cgroup v2 is used where its memory controller is available (the unified hierarchy at /sys/fs/cgroup, or
/sys/fs/cgroup/unified on a hybrid host), delegating `+memory` down to our subtree; otherwise the cgroup v1
memory controller (/sys/fs/cgroup/memory). `unavailable()` says why neither can be used.

cgroup v2 hands a controller to a cgroup's children only while no process sits in that cgroup (the
no-internal-process rule; the write fails EBUSY). In a container our own cgroup holds every process of
it, so they first move into a leaf child, `dverl-harness-leaf`, as kind's and systemd's container
entrypoints do; the containers' cgroups are then made beside that leaf.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
LEAF = "dverl-harness-leaf"
"""Where the processes of our own v2 cgroup move, so that it may delegate its memory controller."""
_names = itertools.count()


def _own(controller: str) -> str:
    """This process's cgroup path for `controller` ("" for the v2 unified entry)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (controller == "" and number == "0") or controller in controllers.split(","):
            return path
    return "/"


def _v2_root() -> Path | None:
    for mount in (ROOT, ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            return mount
    return None


@dataclass(frozen=True)
class Hierarchy:
    version: int
    parent: Path
    """Our own cgroup: containers' cgroups are made below it."""


def hierarchy() -> Hierarchy | None:
    v2 = _v2_root()
    if v2 is not None:
        parent = v2 / _own("").lstrip("/")
        return Hierarchy(2, parent.parent if parent.name == LEAF else parent)
    v1 = ROOT / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        return Hierarchy(1, v1 / _own("memory").lstrip("/"))
    return None


def unavailable() -> str | None:
    """Why this machine cannot enforce container memory limits (None: it can). A probe cgroup is made
    and removed; only a refusal that holds on every run (no controller, no permission) is a reason."""
    found = hierarchy()
    if found is None:
        return "no cgroup memory controller (neither cgroup v2 with memory nor cgroup v1 memory) is mounted"
    try:
        cgroup = MemoryCgroup.make(found, 64 * 2**20)
    except OSError as exc:  # refused (no permission, no controller delegated to us): so on every run
        return f"cannot make a memory cgroup under {found.parent}: {exc}"
    cgroup.remove()
    return None


@dataclass
class MemoryCgroup:
    path: Path
    version: int

    @classmethod
    def make(cls, where: Hierarchy, limit_bytes: int) -> MemoryCgroup:
        if where.version == 2:
            delegate_memory(where.parent)
        path = where.parent / f"dverl-harness-{os.getpid()}-{next(_names)}"
        path.mkdir()
        cgroup = cls(path, where.version)
        if where.version == 2:
            (path / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):  # no swap beyond the limit, where swap accounting exists
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return cgroup

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer took in this cgroup."""
        source = self.path / ("memory.events" if self.version == 2 else "memory.oom_control")
        with contextlib.suppress(OSError):
            for line in source.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def kill_all(self) -> None:
        with contextlib.suppress(OSError):
            for pid in self.procs.read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        self.kill_all()
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


def delegate_memory(parent: Path) -> None:
    """Enable the memory controller for `parent`'s children (v2), moving the processes in `parent` into
    its leaf child first when the kernel refuses for them."""
    control = parent / "cgroup.subtree_control"
    if "memory" in control.read_text().split():
        return
    try:
        control.write_text("+memory")
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = parent / LEAF
    leaf.mkdir(exist_ok=True)
    for pid in (parent / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread (EINVAL)
            (leaf / "cgroup.procs").write_text(pid)
    control.write_text("+memory")


def enter_command(procs: Path) -> list[str]:
    """The prefix that moves the container's first process into the cgroup before it execs on."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]
