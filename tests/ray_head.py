"""One small real Ray head on 127.0.0.1 for a test module, started as its own process group and ended by
that group alone (`ray stop` would end every Ray on the machine, other people's too)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import free_port

ROOT = Path(__file__).resolve().parents[1]
RAY_OWN_PORTS = range(10001, 20000)
"""Ports a Ray head takes for itself by default (its client server, then its workers' range): a head
told to listen on one of them refuses to start."""


def _reachable(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def ray_head(tmp: Path, num_cpus: int = 6) -> Iterator[str]:
    """A Ray head (`ray start --head --block`) whose workers import this checkout; yields its address.

    `num_cpus` is Ray's logical count, what actors reserve: the tiny job's five workers each ask for one;
    their torch threads are one each (the executor sizes them from their reservation).
    """
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'decentralized-verl[ray]')")
    ray = Path(sys.executable).parent / "ray"
    port = free_port()
    while port in RAY_OWN_PORTS:
        port = free_port()
    env = dict(os.environ)
    paths = [str(ROOT / "worker_image"), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
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
    try:
        deadline = time.monotonic() + 120
        while not _reachable(port):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"a Ray head could not start here: {(tmp / 'ray-head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        _end_group(head)
        log.close()


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
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=10)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _session(int(entry.name)) == head.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=10)
