"""Run an untrusted Python program on one stdin in a limited child process (the `code` reward's engine).

Layers, each sufficient for some attacks and together covering the hostile tests:
- parent side: wall-clock deadline, output cap (reading stops and the process group is killed when the
  program prints more than `max_output_bytes`), scrubbed environment, private temp dir as cwd/HOME,
  a new session so the whole process group is killed at the end;
- child side (`_sandbox_bootstrap.py`, run with `python -I -S`): RLIMIT_CPU / RLIMIT_AS / RLIMIT_FSIZE /
  RLIMIT_NOFILE, a private network namespace when the kernel allows it, dropping root to `nobody` (so
  RLIMIT_NPROC is enforced: root ignores it), and an audit hook refusing fork/exec/subprocess, sockets,
  ctypes, kill, and file writes outside the temp dir / reads outside the stdlib.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

_BOOTSTRAP = Path(__file__).with_name("_sandbox_bootstrap.py")
NOBODY_UID = 65534

Status = Literal["ok", "error", "timeout", "cpu_limit", "output_limit", "sandbox_error"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource policy for one program run. Defaults suit competitive-programming style tests."""

    wall_time_s: float = 6.0
    cpu_time_s: int = 4
    memory_bytes: int = 512 * 1024 * 1024
    max_output_bytes: int = 1024 * 1024
    max_file_bytes: int = 16 * 1024 * 1024
    max_processes: int = 64
    isolate_network: bool = True
    drop_privileges: bool = True
    audit_hook: bool = True
    python: str = sys.executable


@dataclass(frozen=True)
class RunOutcome:
    """What one run did: status, exit code (negative = killed by that signal), captured output."""

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float


def run_python(code: str, stdin: str, limits: SandboxLimits = SandboxLimits()) -> RunOutcome:
    """Run `code` with `stdin` under `limits`; never raises for anything the program does."""
    workdir = Path(tempfile.mkdtemp(prefix="dverl-sandbox-")).resolve()
    try:
        (workdir / "solution.py").write_text(code, encoding="utf-8")
        drop = limits.drop_privileges and os.geteuid() == 0
        if drop:
            os.chown(workdir, NOBODY_UID, NOBODY_UID)
            os.chown(workdir / "solution.py", NOBODY_UID, NOBODY_UID)
        return _run(workdir, stdin.encode("utf-8", "surrogateescape"), limits, drop)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _policy(limits: SandboxLimits, drop: bool) -> str:
    policy = asdict(limits)
    policy.pop("python")
    policy["drop_privileges"] = drop
    policy["uid"] = NOBODY_UID
    return json.dumps(policy)


def _run(workdir: Path, stdin: bytes, limits: SandboxLimits, drop: bool) -> RunOutcome:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "PYTHONIOENCODING": "utf-8"}
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [limits.python, "-I", "-S", "-B", str(_BOOTSTRAP), str(workdir), _policy(limits, drop)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return RunOutcome("sandbox_error", None, "", f"could not start python: {exc}", 0.0)
    try:
        out, err, overrun = _pump(proc, stdin, limits, started + limits.wall_time_s)
    finally:
        _kill_group(proc)
        returncode = proc.wait()
    wall = time.monotonic() - started
    status: Status
    if overrun is not None:
        status = overrun
    elif returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and wall < limits.wall_time_s):
        status = "cpu_limit"
    elif returncode != 0:
        status = "error"
    else:
        status = "ok"
    decode = lambda b: b.decode("utf-8", "replace")  # noqa: E731
    return RunOutcome(status, returncode, decode(out), decode(err[-4096:]), wall)


def _pump(
    proc: subprocess.Popen[bytes], stdin: bytes, limits: SandboxLimits, deadline: float
) -> tuple[bytes, bytes, Status | None]:
    """Feed stdin and collect stdout/stderr until both close, the deadline passes or output overflows."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    total = 0
    offset = 0
    with selectors.DefaultSelector() as sel:
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        in_fd = proc.stdin.fileno()
        if stdin:
            os.set_blocking(in_fd, False)
            sel.register(in_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while any(key.fd in buffers for key in sel.get_map().values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), "timeout"
            for key, _ in sel.select(min(remaining, 1.0)):
                if key.fd == in_fd:
                    try:
                        offset += os.write(in_fd, stdin[offset : offset + 65536])
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        offset = len(stdin)
                    if offset >= len(stdin):
                        sel.unregister(in_fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buffers[key.fd] += chunk
                total += len(chunk)
                if total > limits.max_output_bytes:
                    return (
                        bytes(buffers[proc.stdout.fileno()][: limits.max_output_bytes]),
                        bytes(buffers[proc.stderr.fileno()][-4096:]),
                        "output_limit",
                    )
        if not proc.stdin.closed:
            proc.stdin.close()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), "timeout"
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the program's whole session (it leads its own group), ignoring one already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            with contextlib.suppress(OSError):
                stream.close()
