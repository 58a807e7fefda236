"""One small real Ray head on 127.0.0.1 for a test module, started as its own process group and ended by
that group alone (`ray stop` would end every Ray on the machine, other people's too).

Every port Ray would take by number is named instead (GCS, client server, dashboard and its agent: from
`free_port`, which no other Ray default nor the kernel hands out), and its workers bind ports the kernel
picks: another Ray head on the same machine (someone else's test run) cannot collide with this one."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import free_port

SESSION_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
"""Ray's token authentication for every head the tests start, put in the test process's environment when
the tests load (tests/conftest.py): Ray fixes a process's auth mode the first time it loads, and a test
module that imports Ray before a head is up would otherwise leave this process unable to join one."""


def ray_client_env() -> dict[str, str]:
    """This environment with the product's two source folders on PYTHONPATH, so the Ray workers the head
    starts import the same code as the test process."""
    env = dict(os.environ)
    paths = [str(ROOT / "worker_image"), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def dverl_on_ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dverl ARGS...` as a user types it against a Ray head, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", *args],
        env=ray_client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _reachable(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def ray_head(tmp: Path, num_cpus: int = 6) -> Iterator[str]:
    """A Ray head (`ray start --head --block`) whose workers import this checkout; yields its address.

    `num_cpus` is Ray's logical count, what actors reserve: the tiny job's five workers each ask for one;
    their torch threads are one each (the executor sizes them from their reservation). Where Ray is
    installed with the dev extras (scripts/install.sh), so a missing Ray fails the test, as does a head
    that does not come up.
    """
    if importlib.util.find_spec("ray") is None:
        pytest.fail("Ray is not installed: scripts/install.sh installs it (the `ray` extra, part of `dev`)")
    ray = Path(sys.executable).parent / "ray"
    port, client, dashboard, agent = (free_port() for _ in range(4))
    env = dict(os.environ)
    paths = [str(ROOT / "worker_image"), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray's token authentication, as docs/ray.md asks of every cluster a job runs on: the head refuses a
    # client without the token; this test process (and the drivers it starts) holds it while the head runs.
    auth = SESSION_AUTH
    env.update(auth)
    temp = Path("/tmp") / f"ray-{os.getpid()}"  # a Unix socket path under it must stay short
    log = (tmp / "ray-head.log").open("w")
    head = subprocess.Popen(
        [
            str(ray),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--ray-client-server-port={client}",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={agent}",
            "--min-worker-port=0",  # the kernel picks each worker's port
            "--max-worker-port=0",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            "--include-dashboard=false",
            f"--object-store-memory={100 * 1024 * 1024}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    try:
        deadline = time.monotonic() + 120
        while not _reachable(port):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start: {(tmp / 'ray-head.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        _end_group(head)
        log.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _session(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[3])


def _end_group(head: subprocess.Popen) -> None:
    """SIGTERM the head's process group (`ray start --block` stops its services on it), then SIGKILL
    whatever of its session is left: Ray's worker processes lead process groups of their own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGTERM)
    # Ray's own stop takes longer than this (it waits on its services one by one): a little grace for
    # them to let go of their sockets, then the session goes, as it would in the end anyway.
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=3)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _session(int(entry.name)) == head.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=10)
