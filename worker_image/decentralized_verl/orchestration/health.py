"""Which workers to skip: one that failed stays out of dispatch until its Health says ready again.

A dead worker, one that is restarting (loading its model) or one stopped by a signal would otherwise be
handed work, and fail, on every step until it is back. Instead a failed worker is probed in the
background with exponential backoff; it rejoins once it answers ready. Clients that cannot be probed (an
in-process role, a volunteer, whose comings and goings discovery tracks) are never held out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0


def probe_of(client: Any) -> Callable[[], Any] | None:
    """`client.ready(timeout)` when the client can ask its worker's Health, else None."""
    ready = getattr(client, "ready", None)
    return None if ready is None else lambda: ready(PROBE_TIMEOUT_S)


class HealthGate:
    def __init__(self, *, first_s: float = 0.5, max_s: float = 15.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.down: dict[str, float] = {}
        """Worker id -> when it went down."""
        self._probes: dict[str, asyncio.Task[None]] = {}
        self.returned: list[str] = []
        """Workers that came back, in order (metrics and tests)."""

    def is_up(self, worker_id: str) -> bool:
        return worker_id not in self.down

    def up(self, worker_ids: Iterable[str]) -> list[str]:
        return [w for w in worker_ids if w not in self.down]

    def mark_down(self, worker_id: str, client: Any) -> None:
        """Hold the worker out until a probe says it is ready (no-op for clients that cannot be probed)."""
        probe = probe_of(client)
        if probe is None or worker_id in self.down:
            return
        self.down[worker_id] = time.monotonic()
        self._probes[worker_id] = asyncio.create_task(
            self._probe(worker_id, probe), name=f"probe-{worker_id}"
        )

    async def _probe(self, worker_id: str, probe: Callable[[], Any]) -> None:
        wait = self.first_s
        while True:
            await asyncio.sleep(wait)
            try:
                if await probe():
                    break
            except Exception as exc:  # unreachable, refusing, timed out: still down
                log.debug("%s not ready yet: %s", worker_id, exc)
            wait = min(wait * 2, self.max_s)
        log.info("%s is ready again after %.1fs", worker_id, time.monotonic() - self.down[worker_id])
        self.down.pop(worker_id, None)
        self._probes.pop(worker_id, None)
        self.returned.append(worker_id)

    def forget(self, worker_id: str) -> None:
        """A worker removed for good (scaled away): stop probing it."""
        self.down.pop(worker_id, None)
        task = self._probes.pop(worker_id, None)
        if task is not None:
            task.cancel()

    async def wait_any(self, worker_ids: Iterable[str], timeout: float) -> bool:
        """Wait until one of `worker_ids` is up; False after `timeout` seconds."""
        ids = list(worker_ids)
        deadline = time.monotonic() + timeout
        while not self.up(ids):
            if time.monotonic() >= deadline or not any(w in self._probes for w in ids):
                return False
            await asyncio.sleep(0.2)
        return True

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        for task in self._probes.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probes.clear()
