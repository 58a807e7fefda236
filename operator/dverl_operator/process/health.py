"""/healthz: the operator is alive when it can still do its work, so the liveness probe restarts it when
it cannot: the Kubernetes API does not answer (or no longer serves RLHFJobs), or jobs are known but no
reconcile pass has finished for a long while (a stalled watch or loop). A blocked event loop needs no
check here: it cannot answer the probe at all.

The verdict is a pure function of what was observed; `Health` gathers the observations. The API check is
one discovery GET on a connection of its own (never queued behind reconcile traffic), remembered for a few
seconds so probes from several kubelet retries cost one request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


def verdict(
    *, api_error: str | None, jobs: int, since_last_pass: float | None, stall_after: float
) -> str | None:
    """Why the operator is unhealthy, or None when it is healthy.

    `since_last_pass`: seconds since a reconcile pass last finished (None: none yet, or no job known)."""
    if api_error is not None:
        return f"cannot reach the Kubernetes API: {api_error}"
    if jobs and since_last_pass is not None and since_last_pass > stall_after:
        return (
            f"no reconcile pass has finished for {since_last_pass:.0f}s while {jobs} RLHFJob(s) are known "
            f"(more than {stall_after:.0f}s): the watch or the reconcile loop has stalled"
        )
    return None


@dataclass
class Health:
    api_probe: Callable[[], Awaitable[None]]
    """Raises when the API server does not answer or does not serve RLHFJobs."""
    jobs: Callable[[], int]
    """RLHFJobs this operator reconciles now."""
    last_pass: Callable[[], float | None]
    """time.monotonic() of the last finished reconcile pass."""
    stall_after: float
    probe_timeout: float = 5.0
    cache_seconds: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _cached: tuple[float, str | None] | None = field(default=None, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    async def _api_error(self) -> str | None:
        async with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            try:
                await asyncio.wait_for(self.api_probe(), self.probe_timeout)
                error = None
            except TimeoutError:
                error = f"no answer within {self.probe_timeout:.0f}s"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            self._cached = (self.clock(), error)
            return error

    async def problem(self) -> str | None:
        """None when healthy, else why not."""
        last = self.last_pass()
        return verdict(
            api_error=await self._api_error(),
            jobs=self.jobs(),
            since_last_pass=None if last is None else self.clock() - last,
            stall_after=self.stall_after,
        )

    async def route(self) -> tuple[int, bytes, str]:
        """The /healthz answer: 200 `ok`, or 503 with the reason (the kubelet logs it in the pod's events)."""
        problem = await self.problem()
        if problem is None:
            return 200, b"ok\n", "text/plain"
        return 503, f"unhealthy: {problem}\n".encode(), "text/plain"
