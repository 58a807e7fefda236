"""Real processes for the multi-process tests: free ports, the console-script environment, test modules
run as scripts, and a group of named commands whose output is kept per command (what a user would see in
separate terminals)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from netlab.jobs import BIN, process_env, stop_process  # noqa: F401 (BIN: for the tests' own use)

from decentralized_verl.runtime.ports import free_port  # noqa: F401 (the tests' one way to pick a port)
from tests.support.paths import ROOT


def console_env(**extra: str) -> dict[str, str]:
    """The console scripts beside this Python (CI runs `.venv/bin/python -m pytest` without activating the
    venv), one thread per process: `netlab.jobs.process_env`, the one home of that environment."""
    return process_env(**extra)


STEP_LINE = re.compile(r"\bstep (\d+)/\d+\b")
"""The learner's own progress line, one a step (`step 12/200 reward 0.412 ...`)."""


def learner_step(log: str | Path) -> int:
    """The last step the learner's progress lines report, in `log` or the log file it names (0 before the
    first, or before the file exists)."""
    if isinstance(log, Path):
        log = log.read_text(errors="replace") if log.exists() else ""
    steps = STEP_LINE.findall(log)
    return int(steps[-1]) if steps else 0


def wait_for_step(
    log: Path | Callable[[], str],
    step: int,
    timeout: float = 300.0,
    *,
    alive: Callable[[], bool] | None = None,
) -> int:
    """Poll the learner's log (its file, or what reads it) until it reports `step` or later; that step.
    Fails when `alive` says the learner is gone first, naming the log's end."""
    read = (lambda: log.read_text(errors="replace") if log.exists() else "") if isinstance(log, Path) else log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = read()
        if (reached := learner_step(text)) >= step:
            return reached
        if alive is not None and not alive():
            raise AssertionError(f"the learner ended before step {step}:\n{text[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"no step {step} from the learner in {timeout:g}s:\n{read()[-3000:]}")


def wait_for_line(
    path: Path, pattern: str, timeout: float = 120.0, *, alive: Callable[[], bool] | None = None
) -> re.Match:
    """Poll the log file at `path` until `pattern` is in it; the match. Fails when `alive` says the process
    the test hinges on is gone first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if found := re.search(pattern, text):
            return found
        if alive is not None and not alive():
            break
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in {path.name}:\n{path.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def held(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) for the block and continued after, however the block ends: a fault a
    test deals meanwhile lands before the process can run on, so a fast machine cannot end the job first."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def dverl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dverl ARGS...` as a user types it (this Python's module), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def script_argv(path: str | Path, *args: str) -> list[str]:
    """A test module run as a script (a volunteer that cheats, a rogue peer), importing `tests.support` and
    `netlab` as the suite does: the checkout and testing/ on its path. Only such scripts get them; product
    processes run without the test tooling, as they do in a real deployment."""
    path_entries = [str(ROOT), str(ROOT / "testing"), os.environ.get("PYTHONPATH", "")]
    pythonpath = os.pathsep.join(p for p in path_entries if p)
    return ["/usr/bin/env", f"PYTHONPATH={pythonpath}", sys.executable, str(path), *args]


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
