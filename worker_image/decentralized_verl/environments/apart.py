"""User environments (`module:Class`) run apart from the secrets of the process that plays or replays them.

A rollout worker holds its role's token, a reward worker its own, a learner replaying episodes in-process
the weight-signing key: a user's environment must share the memory of none of them. Once the process
entry says so (`run_user_environments_apart`, for every process handed secrets), each user environment
lives in one long-lived child, the kind user rewards run in (`rewards.apart`): a fresh interpreter (nothing
of this process's memory), no `DVERL_*` variable, no inherited descriptor, the same `sys.path`. Here an
`ApartEnvironment` stands for each instance and forwards `reset` and `step`; the child's classes are
imported, their options validated and their `preflight` run there too. Environments shipped with the
package stay in-process: they are this project's code.

The child answers one call at a time, so a user environment's episodes step one after another. A call
that does not answer within its deadline has the child killed and started again: the episodes it held
end as tool errors, and the next ones play on.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from dataclasses import asdict
from typing import Any, ClassVar

from decentralized_verl.environments.base import EpisodeRecord, StepInfo, StepResult
from decentralized_verl.runtime.secret_free_child import start_secret_free_child

SHIPPED = "decentralized_verl."
"""Environments of this package: run where they are called."""

_apart = False


def run_user_environments_apart() -> None:
    global _apart
    _apart = True


def runs_apart(name: str) -> bool:
    """Whether `name` is a user's environment this process must not run itself."""
    return _apart and ":" in name and not name.startswith(SHIPPED)


class ChildFailed(RuntimeError):
    """The child did not answer (it died, or missed the deadline and was killed)."""


class EnvironmentChild:
    """The child user environments live in; one call at a time (callers queue on a lock), started on first
    use and again after it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.generation = 0
        """How many children were started: an instance made in an earlier one is gone."""
        self.forgotten: list[tuple[int, int]] = []
        """(generation, handle) of instances dropped here, for their child to drop with the next call (a
        finaliser may run inside a call, holding the lock, so it never calls itself)."""

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = start_secret_free_child("decentralized_verl.environments._user_env_child", text=False)
        self.generation += 1
        return self._proc

    def call(self, request: dict[str, Any], timeout_s: float) -> tuple[Any, int]:
        """The child's answer to `request` and the generation of the child that gave it; raises what the
        child's call raised (as RuntimeError or ValueError with its message) or ChildFailed."""
        with self._lock:
            proc = self._started()
            dropped, self.forgotten[:] = list(self.forgotten), []
            forget = [handle for generation, handle in dropped if generation == self.generation]
            line = (json.dumps({**request, "forget": forget}) + "\n").encode()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                reply = _read_line(proc.stdout, timeout_s)
            except (OSError, TimeoutError) as exc:
                self._kill()
                raise ChildFailed(f"the user environments' process failed ({exc})") from None
            generation = self.generation
        answer = json.loads(reply)
        if "error" in answer:
            kind = ValueError if answer.get("kind") == "ValueError" else RuntimeError
            raise kind(answer["error"])
        return answer["value"], generation

    def _kill(self) -> None:
        self.generation += 1  # what the killed child held is gone from now on
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        with self._lock:
            self._kill()


def _read_line(stream: Any, timeout_s: float) -> bytes:
    fd = stream.fileno()
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no answer within {timeout_s:g}s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise OSError("the process ended")
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)


_child = EnvironmentChild()

CALL_TIMEOUT_S = 60.0
"""The deadline of a call that is not an episode's step (import, options, preflight, instructions)."""


class ApartEnvironment:
    """One user environment instance, living in the child."""

    instructions: ClassVar[str] = ""

    def __init__(self, name: str, options: dict[str, Any], timeout_s: float) -> None:
        self.timeout_s = timeout_s
        request = {"op": "make", "name": name, "options": options}
        self.handle, self.generation = _child.call(request, max(timeout_s, CALL_TIMEOUT_S))

    def _call(self, op: str, **fields: Any) -> Any:
        if self.generation != _child.generation:
            raise ChildFailed("the user environments' process was restarted: this episode's state is gone")
        value, _ = _child.call({"op": op, "id": self.handle, **fields}, self.timeout_s)
        return value

    def reset(self, record: EpisodeRecord) -> None:
        self._call("reset", record=asdict(record))

    def step(self, turn: str) -> Any:
        value = self._call("step", turn=turn)
        if not isinstance(value, dict):
            raise TypeError(f"the environment's step returned {value!r}, not StepResult")
        info = StepInfo(**value.pop("info"))
        return StepResult(**value, info=info)

    def __del__(self) -> None:  # the child forgets the instance with the next call
        if hasattr(self, "handle"):
            _child.forgotten.append((self.generation, self.handle))


def make_apart(name: str, options: dict[str, Any], timeout_s: float) -> ApartEnvironment:
    return ApartEnvironment(name, options, timeout_s)


def preflight_apart(name: str, options: dict[str, Any]) -> None:
    """The options validated and the class's `preflight` run, in the child; ValueError naming the problem."""
    _child.call({"op": "preflight", "name": name, "options": options}, CALL_TIMEOUT_S)


def instructions_apart(name: str) -> str:
    value, _ = _child.call({"op": "instructions", "name": name}, CALL_TIMEOUT_S)
    return str(value)
