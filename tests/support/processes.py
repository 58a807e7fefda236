"""Real processes for the multi-process tests: free ports, the console-script environment, and a group of
named commands whose output is kept per command (what a user would see in separate terminals).

Imported by the volunteer, fan-out and membership tests; `tests/` is on sys.path under pytest (rootdir
conftest-less import mode) and when a test file runs as a script.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from netlab.jobs import BIN, process_env, stop_process  # noqa: F401 (BIN: for the tests' own use)

from decentralized_verl.runtime.ports import free_port  # noqa: F401 (the tests' one way to pick a port)


def console_env(**extra: str) -> dict[str, str]:
    """The console scripts beside this Python (CI runs `.venv/bin/python -m pytest` without activating the
    venv), one thread per process: `netlab.jobs.process_env`, the one home of that environment."""
    return process_env(**extra)


class ProcessGroup:
    """Named commands started in `cwd`, each logging to `<name>.log` there; all stopped on close.

    Each runs in its own session: `stop` sends SIGTERM to the process, and if it has not exited after the
    grace period, SIGKILL to its whole process group (children included).
    """

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, cmd: str | list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        argv = cmd.split() if isinstance(cmd, str) else cmd
        with (self.cwd / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=console_env(**(extra_env or {})),
                cwd=self.cwd,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.cwd / f"{name}.log").read_text()

    def wait_for(
        self, name: str, pattern: str, timeout: float = 120.0, *, also_alive: str | None = None
    ) -> re.Match:
        """Wait for `pattern` in `name`'s output; fail early when it exits, or when `also_alive` (the
        process the test hinges on, e.g. the learner) has failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log(name))
            if found:
                return found
            if self.procs[name].poll() is not None:
                break
            watched = self.procs.get(also_alive) if also_alive else None
            if watched is not None and watched.poll() not in (None, 0):
                raise AssertionError(f"{also_alive} died:\n{self.log(also_alive)[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{name}: no {pattern!r} in its output:\n{self.log(name)[-3000:]}")

    def stop(self, name: str, timeout: float = 20.0) -> int:
        return stop_process(self.procs[name], timeout)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name in self.procs:
            self.stop(name)
        for proc in self.procs.values():  # children left behind by a process killed outright
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def leave_group(queue) -> None:
    """End a spawned gloo rank the way the product's learners end (`distributed.exit_process`): hand the
    results over, meet the other ranks, and leave without interpreter teardown, where destroying the group
    can wait on the GIL forever or abort."""
    import torch.distributed as dist

    from decentralized_verl.training.distributed import exit_process

    queue.close()
    queue.join_thread()  # what was put has reached the pipe
    dist.barrier()
    exit_process(0)
