"""/healthz (liveness) and /readyz (readiness): what the kubelet is told about the operator.

Ready: the Kubernetes API answers, still serves RLHFJobs, and a watch of them opens with the operator's
credentials (so kopf's watch can work). Not ready is not a reason to restart: an API server that is away
comes back without the operator's help.

Alive: ready, and the loop does its work. The liveness probe restarts the operator when a watch of
RLHFJobs cannot be opened (a broken watch leaves jobs unseen), when jobs are known but no reconcile pass
has finished for a long while (a stalled loop), or when passes keep failing with none succeeding for that
long (every call refused, say, after its RBAC changed): a fresh process re-reads its credentials and
starts its watches anew. A blocked event loop needs no check here: it cannot answer the probe at all.

The verdicts are pure functions of what was observed; `Health` gathers the observations. The API check
runs on a connection of its own (never queued behind reconcile traffic), remembered for a few seconds so
probes from several kubelet retries cost one round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


def readiness(*, api_error: str | None) -> str | None:
    """Why the operator is not ready, or None."""
    if api_error is not None:
        return f"cannot reach the Kubernetes API or watch RLHFJobs: {api_error}"
    return None


def verdict(
    *,
    api_error: str | None,
    jobs: int,
    since_last_pass: float | None,
    stall_after: float,
    failing_for: float | None = None,
    last_failure: str = "",
) -> str | None:
    """Why the operator is not alive, or None when it is.

    `since_last_pass`: seconds since a reconcile pass last finished (None: none yet, or no job known).
    `failing_for`: seconds since the first of the passes that have failed since one last succeeded
    (None: the last pass succeeded, or none ran)."""
    not_ready = readiness(api_error=api_error)
    if not_ready is not None:
        return not_ready
    if jobs and since_last_pass is not None and since_last_pass > stall_after:
        return (
            f"no reconcile pass has finished for {since_last_pass:.0f}s while {jobs} RLHFJob(s) are known "
            f"(more than {stall_after:.0f}s): the watch or the reconcile loop has stalled"
        )
    if jobs and failing_for is not None and failing_for > stall_after:
        last = f" (last: {last_failure})" if last_failure else ""
        return (
            f"every reconcile pass has failed for {failing_for:.0f}s while {jobs} RLHFJob(s) are known "
            f"(more than {stall_after:.0f}s){last}"
        )
    return None


@dataclass
class Health:
    api_probe: Callable[[], Awaitable[None]]
    """Raises when the API server does not answer, does not serve RLHFJobs, or refuses to watch them."""
    jobs: Callable[[], int]
    """RLHFJobs this operator reconciles now."""
    last_pass: Callable[[], float | None]
    """time.monotonic() of the last finished reconcile pass."""
    stall_after: float
    failing_since: Callable[[], tuple[float, str] | None] = lambda: None
    """(time.monotonic() of the first failed pass since one last succeeded, that failure), or None."""
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
        """None when alive, else why not."""
        last = self.last_pass()
        failing = self.failing_since()
        now = self.clock()
        return verdict(
            api_error=await self._api_error(),
            jobs=self.jobs(),
            since_last_pass=None if last is None else now - last,
            stall_after=self.stall_after,
            failing_for=None if failing is None else now - failing[0],
            last_failure="" if failing is None else failing[1],
        )

    async def route(self) -> tuple[int, bytes, str]:
        """The /healthz answer: 200 `ok`, or 503 with the reason (the kubelet logs it in the pod's events)."""
        return _answer(await self.problem())

    async def ready_route(self) -> tuple[int, bytes, str]:
        """The /readyz answer: the API half of the verdict only."""
        return _answer(readiness(api_error=await self._api_error()))


def _answer(problem: str | None) -> tuple[int, bytes, str]:
    if problem is None:
        return 200, b"ok\n", "text/plain"
    return 503, f"unhealthy: {problem}\n".encode(), "text/plain"
