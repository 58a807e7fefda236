"""Serving processes (workers, volunteers) run until SIGTERM/SIGINT, which pods and `dverl run` send, and
their background loops end when they stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

CALL_GRACE_S = 20.0
"""After SIGTERM a serving worker takes no new calls and gives the ones in flight this long to finish
(the caller hands any that do not to another worker). A pod's termination grace period is longer."""


async def until_stopped(stop: asyncio.Event | None = None) -> None:
    """Wait for SIGTERM or SIGINT (or for `stop` to be set by the caller, e.g. a test)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def say(line: str) -> None:
    """Print a line a person or a test waits for (volunteers print their ready and served lines)."""
    print(line, flush=True)


async def serve_until_stopped(
    ready: str,
    *,
    served: Callable[[], str] | None = None,
    stop: asyncio.Event | None = None,
    announce: Callable[[str], None] = say,
) -> int:
    """How every serving process ends: say it is ready, serve until stopped, say what it served."""
    announce(ready)
    await until_stopped(stop)
    if served is not None:
        announce(served())
    return 0


async def cancel_and_wait(task: asyncio.Task | None, *, again_after_s: float = 1.0) -> None:
    """End a background loop (a heartbeat, a poller) and wait until it has ended.

    One cancel is not always enough on Python 3.11: `asyncio.wait_for` returns its call's result and drops
    the cancellation when the two arrive in the same turn of the event loop (more likely the busier the
    machine), and the loop then runs on, so awaiting it once would wait forever. The task is cancelled
    again until it ends; an error it ended with is raised here."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after_s)
    if not task.cancelled():
        task.result()
