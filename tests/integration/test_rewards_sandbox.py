"""Hostile programs against the code sandbox: each limit is shown to hold with a real subprocess."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from decentralized_verl.rewards.sandbox import SandboxLimits, run_python
from tests.support.node_harness import refused

FAST = SandboxLimits(wall_time_s=5.0, cpu_time_s=2)
SYSTEM_PYTHON = shutil.which("python3.11", path="/usr/bin")
NAMESPACES_REFUSED = refused()
"""Whether this machine lets root make network namespaces (the sandbox's second layer needs it)."""


def test_plain_program_reads_stdin_and_writes_stdout() -> None:
    out = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", "1 2 3\n4\n", FAST)
    assert (out.status, out.returncode, out.stdout) == ("ok", 0, "10\n")


def test_large_stdin_round_trips() -> None:
    data = "".join(f"{i}\n" for i in range(200_000))
    out = run_python("import sys\nprint(len(sys.stdin.read()))", data, FAST)
    assert out.stdout.strip() == str(len(data))


def test_common_stdlib_works_inside() -> None:
    code = (
        "import math, collections, heapq, bisect, itertools, functools, re, json, fractions, dataclasses\n"
        "import sys; sys.setrecursionlimit(10000)\n"
        "@dataclasses.dataclass\nclass P:\n    x: int\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "print(math.comb(5, 2), P(1), open('scratch.txt').read())"
    )
    out = run_python(code, "", FAST)
    assert out.stdout == "10 P(x=1) ok\n", out.stderr


def test_infinite_loop_hits_cpu_limit() -> None:
    started = time.monotonic()
    out = run_python("while True:\n    pass", "", SandboxLimits(wall_time_s=20.0, cpu_time_s=1))
    assert out.status in {"cpu_limit", "timeout"}
    assert time.monotonic() - started < 10.0


def test_sleeping_program_hits_wall_clock_limit() -> None:
    started = time.monotonic()
    out = run_python("import time\ntime.sleep(60)", "", SandboxLimits(wall_time_s=1.0, cpu_time_s=5))
    assert out.status == "timeout"
    assert time.monotonic() - started < 4.0


def test_memory_bomb_is_refused() -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))"
    out = run_python(code, "", SandboxLimits(wall_time_s=10.0, memory_bytes=256 * 1024 * 1024))
    assert out.status == "error"
    assert "MemoryError" in out.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import os\nfor _ in range(100):\n    os.fork()\nprint('forked')",
        "import os\nos.system('echo spawned')\nprint('forked')",
        "import subprocess\nsubprocess.run(['echo', 'spawned'])\nprint('forked')",
        "import os\nos.execv('/bin/echo', ['echo', 'spawned'])",
        "import os\nos.posix_spawn('/bin/echo', ['echo', 'spawned'], {})\nprint('forked')",
        "import ctypes\nctypes.CDLL(None).fork()\nprint('forked')",
        "import _posixsubprocess\nprint('forked')",
        "import pty\npty.fork()\nprint('forked')",
    ],
)
def test_process_creation_is_refused(code: str) -> None:
    out = run_python(code, "", FAST)
    assert out.status == "error"
    assert "forked" not in out.stdout and "spawned" not in out.stdout
    assert "sandbox" in out.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEM_PYTHON is None, reason="needs root and a world-readable python"
)
def test_fork_bomb_bounded_by_nproc_without_audit_hook() -> None:
    """Second layer: with the audit hook off, dropping to `nobody` makes RLIMIT_NPROC bite."""
    code = (
        "import os, time\nok = 0\n"
        "for _ in range(60):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    ok += 1\n"
        "print(os.getuid(), ok)"
    )
    limits = SandboxLimits(wall_time_s=10.0, audit_hook=False, max_processes=8, python=SYSTEM_PYTHON)
    out = run_python(code, "", limits)
    uid, forked = (int(v) for v in out.stdout.split())
    assert uid == 65534
    assert forked < 8


@pytest.fixture
def listening_server():
    """A TCP server on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


CONNECT = (
    "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    "s.sendall(b'leak')\nprint('connected')"
)


def test_socket_connect_is_refused(listening_server) -> None:
    port, accepted = listening_server
    # sanity: the server does accept ordinary connections
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    time.sleep(0.3)
    assert len(accepted) == 1
    out = run_python(CONNECT.format(port=port), "", FAST)
    time.sleep(0.5)
    assert "connected" not in out.stdout
    assert len(accepted) == 1


@pytest.mark.skipif(NAMESPACES_REFUSED is not None, reason=f"no network namespaces: {NAMESPACES_REFUSED}")
def test_network_namespace_blocks_even_without_audit_hook(listening_server) -> None:
    """Second layer: a private network namespace has no route to the host's 127.0.0.1."""
    port, accepted = listening_server
    probe = run_python(
        "import os\nprint(os.readlink('/proc/self/ns/net'))", "", SandboxLimits(audit_hook=False)
    )
    assert probe.stdout.strip() != os.readlink("/proc/self/ns/net"), "the sandbox kept the host's network"
    out = run_python(CONNECT.format(port=port), "", SandboxLimits(wall_time_s=5.0, audit_hook=False))
    time.sleep(0.5)
    assert "connected" not in out.stdout
    assert accepted == []


@pytest.mark.parametrize("how", ["open", "os_open", "relative", "rename"])
def test_writes_outside_temp_dir_are_refused(tmp_path: Path, how: str) -> None:
    target = tmp_path / "pwned.txt"
    code = {
        "open": f"open({str(target)!r}, 'w').write('x')",
        "os_open": f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        "relative": "import os\nopen(os.getcwd() + '/../../../../../../' + {!r}, 'a').write('x')".format(
            str(target).lstrip("/")
        ),
        "rename": f"open('x', 'w').write('x')\nimport os\nos.rename('x', {str(target)!r})",
    }[how]
    out = run_python(code, "", FAST)
    assert out.status == "error", out
    assert not target.exists()


def test_huge_output_is_capped_and_killed() -> None:
    started = time.monotonic()
    limits = SandboxLimits(wall_time_s=20.0, max_output_bytes=64 * 1024)
    out = run_python("while True:\n    print('x' * 1000)", "", limits)
    assert out.status == "output_limit"
    assert len(out.stdout) <= 64 * 1024
    assert time.monotonic() - started < 10.0


def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVERL_TEST_SECRET", "hunter2-secret")
    code = (
        "import os\nprint(dict(os.environ))\n"
        "try:\n    print(open(f'/proc/{os.getppid()}/environ').read())\n"
        "except Exception as e:\n    print(e)\n"
    )
    out = run_python(code, "", FAST)
    assert "hunter2-secret" not in out.stdout + out.stderr
    assert "DVERL_TEST_SECRET" not in out.stdout


def test_reading_files_outside_the_stdlib_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("hunter3")
    out = run_python(f"print(open({str(secret)!r}).read())", "", FAST)
    assert "hunter3" not in out.stdout
    assert out.status == "error"


def test_temp_dir_is_removed() -> None:
    out = run_python("import os\nprint(os.getcwd())", "", FAST)
    assert not Path(out.stdout.strip()).exists()
