"""Prometheus metrics (reconciles, errors, jobs by phase) and the HTTP endpoints that serve them.

A private CollectorRegistry keeps the numbers per operator instance (tests run several in one process).
/metrics and /healthz are served from the operator's own event loop, on separate ports when asked,
so a follower replica (not the leader) is still alive and observable.
"""

from __future__ import annotations

import inspect
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from decentralized_verl.spec import RLHFJobStatus

PHASES: tuple[str, ...] = typing.get_args(RLHFJobStatus.model_fields["phase"].annotation)
"""Every phase the status schema allows (Queued included), so each has a gauge from the start."""


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.reconciles = Counter(
            "dverl_operator_reconciles", "Reconcile passes over RLHFJobs", ["result"], registry=self.registry
        )
        self.errors = Counter(
            "dverl_operator_errors", "Reconcile passes that raised", ["kind"], registry=self.registry
        )
        self.jobs = Gauge("dverl_operator_jobs", "RLHFJobs by phase", ["phase"], registry=self.registry)
        self.latency = Histogram(
            "dverl_operator_reconcile_seconds",
            "Duration of one reconcile pass",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.leader = Gauge(
            "dverl_operator_leader", "1 when this replica holds the Lease", registry=self.registry
        )
        self._phases: dict[tuple[str, str], str] = {}
        self.last_pass: float | None = None
        """time.monotonic() when a reconcile pass last finished (what /healthz's stall check reads)."""
        self.failing_since: tuple[float, str] | None = None
        """(time.monotonic(), what failed) of the first pass that failed since one last succeeded."""
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)

    def job_phase(self, namespace: str, name: str, phase: str | None) -> None:
        """Record (or, with None, forget) one job's phase and refresh the per-phase gauge."""
        key = (namespace, name)
        if phase is None:
            self._phases.pop(key, None)
        else:
            self._phases[key] = phase
        counts = dict.fromkeys(PHASES, 0)
        for value in self._phases.values():
            counts[value] = counts.get(value, 0) + 1
        for value, count in counts.items():
            self.jobs.labels(phase=value).set(count)

    def pass_finished(self) -> None:
        self.last_pass = time.monotonic()

    def pass_succeeded(self) -> None:
        self.failing_since = None

    def pass_failed(self, what: str) -> None:
        """A failed pass: the first of a run of them starts the clock /healthz reads."""
        if self.failing_since is None:
            self.failing_since = (time.monotonic(), what[:300])

    def jobs_known(self) -> int:
        return len(self._phases)

    def render(self) -> bytes:
        return generate_latest(self.registry)


Answer = tuple[int, bytes, str]
"""(status, body, content type)."""


async def serve(
    port: int, routes: dict[str, Callable[[], Answer] | Callable[[], Awaitable[Answer]]]
) -> web.AppRunner:
    """Serve GET routes on 0.0.0.0:port; each route returns (or, async, resolves to) an Answer."""
    app = web.Application()
    for path, producer in routes.items():

        async def handler(_: web.Request, producer: Callable[[], typing.Any] = producer) -> web.Response:
            answer = producer()
            if inspect.isawaitable(answer):
                answer = await answer
            status, body, content_type = answer
            return web.Response(status=status, body=body, headers={"Content-Type": content_type})

        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


def metrics_route(metrics: Metrics) -> Callable[[], tuple[int, bytes, str]]:
    return lambda: (200, metrics.render(), CONTENT_TYPE_LATEST)
