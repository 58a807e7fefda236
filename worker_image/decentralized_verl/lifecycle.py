"""Serving processes (workers, volunteers) run until SIGTERM/SIGINT, which pods and `dverl run` send."""

from __future__ import annotations

import asyncio
import contextlib
import signal


async def until_stopped(stop: asyncio.Event | None = None) -> None:
    """Wait for SIGTERM or SIGINT (or for `stop` to be set by the caller, e.g. a test)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
