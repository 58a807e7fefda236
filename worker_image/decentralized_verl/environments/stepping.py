"""Environment calls under a deadline: a step that hangs or raises never hangs the rollout worker.

Each call runs in a daemon thread of its own and is waited for at most `timeout_s`; a call that misses
its deadline is reported as a `tool_timeout` and left to finish (or hang) on its own: Python cannot kill
a thread, and a daemon thread does not keep the process alive. Calls on one environment are serialised
by its lock, so a later step of a wedged environment times out too instead of running beside the hung
one. Tools that run programs (python_tool) enforce their own limits in a child process that is killed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from decentralized_verl.environments.base import Environment, EpisodeRecord, StepResult
from decentralized_verl.environments.episode import StepFailure

T = TypeVar("T")


class _Call:
    """One call's outcome, filled in by its thread."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


def _start(fn: Callable[[], Any], lock: threading.Lock) -> _Call:
    call = _Call()

    def run() -> None:
        try:
            with lock:
                call.value = fn()
        except BaseException as exc:  # reported to the waiter, never raised in the thread
            call.error = exc
        finally:
            call.finished.set()

    threading.Thread(target=run, name="environment-step", daemon=True).start()
    return call


def call_all(
    calls: Sequence[tuple[Callable[[], T], threading.Lock]], timeout_s: float
) -> list[T | StepFailure]:
    """Run the calls concurrently: each one's answer, or a StepFailure if it raised or missed the deadline."""
    started = [_start(fn, lock) for fn, lock in calls]
    deadline = time.monotonic() + timeout_s
    out: list[T | StepFailure] = []
    for call in started:
        if not call.finished.wait(max(0.0, deadline - time.monotonic())):
            out.append(StepFailure("tool_timeout", f"the environment did not answer within {timeout_s:g}s"))
        elif call.error is not None:
            message = f"{type(call.error).__name__}: {call.error}"[:500]
            out.append(StepFailure("tool_error", message))
        else:
            out.append(call.value)
    return out


def checked(result: Any) -> StepResult | StepFailure:
    """A step's return value if it is a valid StepResult, else a tool error saying what was wrong."""
    if not isinstance(result, StepResult):
        return StepFailure(
            "tool_error", f"the environment's step returned {type(result).__name__}, not StepResult"
        )
    if result.reward is not None and not (
        isinstance(result.reward, int | float) and math.isfinite(result.reward)
    ):
        return StepFailure("tool_error", f"the environment's step returned reward {result.reward!r}")
    if result.observation is not None and not isinstance(result.observation, str):
        return StepFailure("tool_error", "the environment's observation is not text")
    return result


class Stepper:
    """Resets and steps a batch of environments under the step timeout, one lock per environment."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._locks: dict[int, threading.Lock] = {}

    def _lock(self, env: Environment) -> threading.Lock:
        return self._locks.setdefault(id(env), threading.Lock())

    def reset(
        self, envs: Sequence[Environment], records: Sequence[EpisodeRecord]
    ) -> list[StepFailure | None]:
        """None per environment that reset, else why it did not."""
        calls = [
            (lambda env=env, record=record: env.reset(record), self._lock(env))
            for env, record in zip(envs, records, strict=True)
        ]
        return [r if isinstance(r, StepFailure) else None for r in call_all(calls, self.timeout_s)]

    def step(self, envs: Sequence[Environment], turns: Sequence[str]) -> list[StepResult | StepFailure]:
        calls = [
            (lambda env=env, turn=turn: env.step(turn), self._lock(env))
            for env, turn in zip(envs, turns, strict=True)
        ]
        return [r if isinstance(r, StepFailure) else checked(r) for r in call_all(calls, self.timeout_s)]

    def forget(self, env: Environment) -> None:
        self._locks.pop(id(env), None)
