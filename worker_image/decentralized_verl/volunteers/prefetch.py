"""A volunteer pulls each new weight version as soon as the coordinator has it, not when its next work
item arrives: behind a slow link the pull (a delta, usually) then overlaps the coordinator's update and
the other workers' generation instead of adding to the volunteer's share of the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)


class WeightPrefetch:
    """Polls the newest manifest every `poll_s` and, when it is newer than what `worker` holds, loads it
    (`worker.ensure_version`, which serialises with generation). Failures are logged and retried at the
    next poll: the request path still pulls what it needs."""

    def __init__(self, source, worker, *, poll_s: float = 1.0) -> None:
        self.source, self.worker, self.poll_s = source, worker, poll_s
        self.prefetched = 0
        self._task: asyncio.Task | None = None

    async def once(self) -> bool:
        """Pull the newest version if it is newer than the worker's; whether it did."""
        manifest = await self.source.latest_manifest()
        if manifest is None or manifest.version <= self.worker.version:
            return False
        await asyncio.to_thread(self.worker.ensure_version, manifest.version)
        self.prefetched += 1
        return True

    async def _loop(self) -> None:
        while True:
            try:
                await self.once()
            except Exception as exc:  # unreachable coordinator, a broken transfer: the next poll retries
                log.info("weight prefetch: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.poll_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="weight-prefetch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
