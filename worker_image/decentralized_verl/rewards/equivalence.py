"""Is a predicted math answer equal to the reference, as a grader would accept?

Order of checks, cheapest first:
1. canonical strings equal (`normalize.canonical`) -> equal;
2. both plain numbers (int, decimal, a/b, \\frac{a}{b}) -> exact rational compare; when both are
   integers a difference is final (no sympy needed for the common case);
3. math-verify (symbolic: `2\\sqrt{2}` = `\\sqrt{8}`, `x^2+2x+1` = `(x+1)^2`, intervals, sets, `50\\%` =
   `0.5`) in a separate long-lived process with a wall-clock limit per comparison; on a timeout the
   process is killed (and restarted on next use) and the verdict falls back to step 1's answer (False).
math-verify is never imported in this process: sympy can spin in C code no signal interrupts, and its
own signal-based timeout works only in a main thread (reward workers score in thread pools).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.rewards import normalize

_CHILD = Path(__file__).with_name("_grader_child.py")
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Verdict:
    """Whether two answers are equivalent and which check decided ("string", "number", "math-verify", ...)."""

    equal: bool
    method: str


class MathVerifyProcess:
    """A math-verify child process answering one comparison at a time, killed when it overruns.

    Thread-safe (one comparison in flight; callers queue on a lock). The child starts on first use.
    """

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.restarts = 0

    def compare(self, gold: str, pred: str, timeout_s: float) -> tuple[bool | None, str]:
        """(equal or None when math-verify could not decide, why). Never raises."""
        with self._lock:
            try:
                proc = self._ensure_started(max(timeout_s, 30.0))
                request = json.dumps({"gold": gold, "pred": pred, "timeout": timeout_s}) + "\n"
                assert proc.stdin is not None
                proc.stdin.write(request.encode())
                proc.stdin.flush()
                line = self._read_line(proc, timeout_s)
            except (OSError, ValueError, AssertionError) as exc:
                self._kill()
                return None, f"math-verify process failed: {type(exc).__name__}"
            if line is None:
                self._kill()
                return None, f"math-verify timed out after {timeout_s:g}s"
            reply = json.loads(line)
            return reply["equal"], reply["why"]

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ensure_started(self, startup_timeout_s: float) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._proc is not None:
            self.restarts += 1
        self._proc = subprocess.Popen(
            [self._python, "-I", str(_CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._buffer = b""
        if self._read_line(self._proc, startup_timeout_s) is None:
            self._kill()
            raise OSError("math-verify process did not start")
        return self._proc

    def _read_line(self, proc: subprocess.Popen[bytes], timeout_s: float) -> str | None:
        """One reply line, or None when the child does not answer within timeout_s (or dies)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_DEFAULT_PROCESS: MathVerifyProcess | None = None
_DEFAULT_LOCK = threading.Lock()


def default_process() -> MathVerifyProcess:
    """The shared math-verify process of this worker (started lazily, once)."""
    global _DEFAULT_PROCESS
    with _DEFAULT_LOCK:
        if _DEFAULT_PROCESS is None:
            _DEFAULT_PROCESS = MathVerifyProcess()
        return _DEFAULT_PROCESS


def answers_equivalent(
    pred: str,
    gold: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    use_math_verify: bool = True,
    verifier: MathVerifyProcess | None = None,
) -> Verdict:
    """Decide whether `pred` is an acceptable answer for reference `gold` (see module docstring)."""
    if normalize.canonical(pred) == normalize.canonical(gold):
        return Verdict(True, "string")
    a, b = normalize.plain_number(pred), normalize.plain_number(gold)
    if a is not None and b is not None:
        if a == b:
            return Verdict(True, "number")
        if normalize.is_integer_literal(pred) and normalize.is_integer_literal(gold):
            return Verdict(False, "number")
    if not use_math_verify:
        return Verdict(False, "string")
    equal, why = (verifier or default_process()).compare(
        normalize.light(gold), normalize.light(pred), timeout_s
    )
    if equal is None:
        return Verdict(False, f"string ({why})")
    return Verdict(equal, why)
