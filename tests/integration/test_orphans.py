"""`kill -9` of a process that started helper daemons leaves nothing behind: the DHT bootstrap, an open
volunteer and `dverl run` each end every process below them (hivemind's DHT process and its p2pd, workers)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decentralized_verl.runtime.orphans import _start_time, descendants
from tests.support.job_manifests import e2e_manifest
from tests.support.local_models import save_tiny_model
from tests.support.processes import ProcessGroup, free_port

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _names(pids: set[int]) -> dict[int, str]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    return out


def _survivors(pids: dict[int, int]) -> dict[int, str]:
    """Which of (pid -> start time) still run, excluding pids reused by other processes."""
    return _names({pid for pid, started in pids.items() if _start_time(pid) == started})


def _kill9_then_check(proc: subprocess.Popen, wanted: str, timeout: float = 15.0) -> None:
    """Note the tree under `proc` (it must hold `wanted`), SIGKILL `proc` alone, wait for the tree to go."""
    below = {pid: _start_time(pid) for pid in descendants(proc.pid)}
    assert any(wanted in name for name in _names(set(below)).values()), _names(set(below))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + timeout
    while _survivors(below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _survivors(below) == {}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_the_dht_bootstrap_killed_leaves_no_p2pd_holding_its_port(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    port = free_port()
    try:
        proc = group.start("dht", f"dverl-dht --port {port}")
        group.wait_for("dht", r"--initial-peers (\S+)")
        assert not _port_free(port)
        _kill9_then_check(proc, "p2pd")
        deadline = time.monotonic() + 10
        while not _port_free(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _port_free(port)
    finally:
        group.close()


def test_a_killed_open_volunteer_leaves_nothing_behind(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    model = save_tiny_model(tmp_path / "tiny")
    try:
        group.start("dht", f"dverl-dht --port {free_port()}")
        maddr = group.wait_for("dht", r"--initial-peers (\S+)").group(1)
        proc = group.start("actor", f"dverl-worker --initial-peers {maddr} --model {model} --role actor")
        group.wait_for("actor", r"worker \S+ serves actor")
        _kill9_then_check(proc, "p2pd")
    finally:
        group.close()


def test_a_killed_dverl_run_leaves_no_worker_behind(tmp_path: Path) -> None:
    job = e2e_manifest(tmp_path, "orphans", **{"training.steps": 500, "training.evalEvery": 0})
    group = ProcessGroup(tmp_path)
    try:
        proc = group.start("run", [str(Path(sys.executable).parent / "dverl"), "run", str(job)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            "--role rollout" in name for name in _names(descendants(proc.pid)).values()
        ):
            time.sleep(0.2)
        time.sleep(2.0)  # the workers are up and have started their own helpers
        _kill9_then_check(proc, "--role learner")
    finally:
        group.close()


def test_the_guard_kills_what_its_owner_left_and_nothing_else(tmp_path: Path) -> None:
    """A parent starts a guard and a long child, then is SIGKILLed: the child goes; a stranger stays."""
    code = (
        "import subprocess, sys, time\n"
        "from decentralized_verl.runtime.orphans import guard_descendants\n"
        "assert guard_descendants() is not None and guard_descendants() is None  # once per process\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # the guard has seen the child
        _kill9_then_check(parent, "time.sleep(300)")
        assert stranger.poll() is None
    finally:
        stranger.kill()
        parent.kill()


DAEMON_STARTER = """
import os, subprocess, sys, time
from decentralized_verl.runtime.orphans import guard_descendants
guard_descendants()
# A daemon that leaves the process tree at once (double fork), started before the watchdog's first look.
subprocess.run([sys.executable, "-c", "import os, sys, time\\nif os.fork(): os._exit(0)\\n"
                "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)", sys.argv[1]])
print("started", flush=True)
time.sleep(600)
"""


def test_a_daemon_that_left_the_tree_is_still_ended_by_the_guard_mark(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    group = ProcessGroup(tmp_path)
    try:
        owner = group.start("owner", [sys.executable, "-c", DAEMON_STARTER, str(pid_file)])
        group.wait_for("owner", "started", timeout=60)
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the daemon never wrote its pid"
            time.sleep(0.1)
        daemon = int(pid_file.read_text())
        started = _start_time(daemon)
        assert started is not None and daemon not in descendants(owner.pid)  # out of the tree
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 15
        while _start_time(daemon) == started and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _start_time(daemon) != started, "the daemon outlived its guarded starter"
    finally:
        group.close()


FORKER = """
import os, sys, time
from decentralized_verl.runtime.orphans import guard_descendants
guard_descendants()
pid = os.fork()  # no exec: /proc/PID/environ of the child shows no guard mark
if pid == 0:
    time.sleep(600)
    os._exit(0)
open(sys.argv[1], "w").write(str(pid))
os.kill(os.getpid(), 9)  # gone before the watchdog's first look: the child was never seen below it
"""


def test_a_forked_child_the_guard_never_saw_is_ended_through_the_owners_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    owner = subprocess.Popen([sys.executable, "-c", FORKER, str(pid_file)], start_new_session=True)
    assert owner.wait(60) == -signal.SIGKILL
    child = int(pid_file.read_text())
    started = _start_time(child)
    try:
        deadline = time.monotonic() + 15
        while _start_time(child) == started and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _start_time(child) != started, "the forked child outlived its guarded owner"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


CHILD = """
import sys, time
from decentralized_verl.runtime.orphans import die_with_parent
from decentralized_verl.settings import WorkerSettings
die_with_parent(WorkerSettings.from_env().die_with_parent)
print("alive", flush=True)
time.sleep(60)
"""

PARENT = """
import os, subprocess, sys, time
from decentralized_verl.runtime.orphans import PARENT_VARIABLE
env = {**os.environ, PARENT_VARIABLE: str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_launched_worker_dies_with_its_launcher_and_not_with_a_stranger(tmp_path: Path) -> None:
    from decentralized_verl.runtime.orphans import PARENT_VARIABLE

    # The launcher named some other pid: the child is not where it was meant to be and ends at once.
    env = {**os.environ, PARENT_VARIABLE: str(os.getpid() + 1_000_000)}
    stray = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert stray.returncode == -signal.SIGTERM and "alive" not in stray.stdout
    # The launcher is SIGKILLed: the kernel sends its child SIGTERM.
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    started = _start_time(child)
    time.sleep(1.0)
    assert _start_time(child) == started
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 15
    while _start_time(child) == started and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _start_time(child) != started, "the child outlived its launcher"
