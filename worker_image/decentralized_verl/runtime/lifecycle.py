"""Serving processes (workers, volunteers) run until SIGTERM/SIGINT, which pods and `dverl run` send."""

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
