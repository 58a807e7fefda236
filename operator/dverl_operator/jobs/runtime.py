"""What the kopf handlers share (handed to kopf as `memo`): one level-based reconcile pass of a job at a
time per job, at most `max_concurrent` across jobs, and what passes remember between them.

Each pass reads the job and its children (observe.py), asks the pure `decide` what to do, applies it
(apply.py), and writes `.status` only where it changed. Between full passes a running job's progress is
polled alone, from the last observation, so polling never costs API reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from decentralized_verl.core.status import JobStatus
from dverl_operator.jobs.apply import apply, issue_credentials
from dverl_operator.jobs.coordinator import CoordinatorClient
from dverl_operator.jobs.identity import OperatorIdentity
from dverl_operator.jobs.observe import observe
from dverl_operator.jobs.retry import classify, refused_retry
from dverl_operator.jobs.wakeups import Wakeups
from dverl_operator.kube.client import Cluster
from dverl_operator.objects.pod_state import pod_phase
from dverl_operator.process.metrics import Metrics
from dverl_operator.reconcile.actions import Actions
from dverl_operator.reconcile.decide import decide
from dverl_operator.reconcile.observed import Observed
from dverl_operator.reconcile.settings import Settings
from dverl_operator.status.refusals import Refusal, with_refusals

log = logging.getLogger(__name__)
CREDENTIALS_RECHECK_SECONDS = 300.0


@dataclass
class Runtime:
    cluster: Cluster
    settings: Settings
    coordinator: CoordinatorClient
    metrics: Metrics
    identity: OperatorIdentity
    """Issues each job's credentials and rebuilds what the Status client needs (identity.py)."""
    status_interval: float = 5.0
    max_concurrent: int = 16
    """Passes running at once across all jobs (controller-runtime's MaxConcurrentReconciles)."""
    wakeups: Wakeups = field(default_factory=Wakeups)
    _progress: dict[tuple[str, str], tuple[float, JobStatus | None]] = field(default_factory=dict)
    _spec_seen: dict[tuple[str, str], str] = field(default_factory=dict)
    first_reconciled: dict[tuple[str, str], float] = field(default_factory=dict)
    _credentials_seen: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(namespace, job, uid) -> when its credentials Secret was last made or found to exist."""
    _refused: dict[tuple[str, str], int] = field(default_factory=dict)
    """Passes in a row whose creates the API server refused, per job (their backoff)."""
    _observed: dict[tuple[str, str], Observed] = field(default_factory=dict)
    """Each job's last full observation, its status as the last pass left it."""
    _slots: asyncio.Semaphore | None = None

    async def reconcile_when_free(self, namespace: str, name: str, *, light: bool = False) -> float:
        """A pass, once one of `max_concurrent` slots is free: many jobs never flood the API server."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        async with self._slots:
            return await self.reconcile_once(namespace, name, light=light)

    async def _progress_only(self, namespace: str, name: str) -> Observed | None:
        """The last full observation with fresh coordinator progress, without reading the API server:
        between full passes (which run on every watch event of the job or its pods, and at each resync)
        only progress changes, so polling it must not cost each job six API reads every few seconds."""
        cached = self._observed.get((namespace, name))
        return None if cached is None else await self._with_progress(namespace, name, cached)

    async def observe(self, namespace: str, name: str) -> Observed | None:
        """The job and its children as the API has them, with the coordinator's progress."""
        seen = await observe(self.cluster, self.settings, namespace, name)
        return None if seen is None else await self._with_progress(namespace, name, seen)

    async def _with_progress(self, namespace: str, name: str, seen: Observed) -> Observed:
        """`seen` with the coordinator's progress polled now, the clock and whether credentials are known."""
        uid = str(seen.job["metadata"].get("uid") or "")
        progress = await self._poll(namespace, name, uid, seen.pods)
        return replace(
            seen,
            progress=progress,
            now=time.time(),
            credentials_ready=self._credentials_fresh(namespace, name, uid),
        )

    def _credentials_fresh(self, namespace: str, name: str, uid: str) -> bool:
        """Known to exist within the last few minutes; after that, one create (409: still there) confirms
        it again, so a Secret deleted by hand is made anew before a restarted pod needs it. The operator
        never reads a job's Secret."""
        seen = self._credentials_seen.get((namespace, name, uid))
        return seen is not None and time.monotonic() - seen < CREDENTIALS_RECHECK_SECONDS

    async def _poll(self, namespace: str, name: str, uid: str, pods: Mapping[str, Any]) -> JobStatus | None:
        """The coordinator's progress, at most every status_interval; only once learner 0 runs."""
        learner0 = pods.get(f"{name}-learner-0")
        if learner0 is None or pod_phase(learner0) != "Running":
            return self._progress.get((namespace, name), (0.0, None))[1]
        key = (namespace, name)
        polled_at, last = self._progress.get(key, (0.0, None))
        if time.monotonic() - polled_at < self.status_interval:
            return last
        progress = await self.coordinator.progress(
            name, namespace, self.identity.caller(namespace, name, uid)
        )
        progress = progress if progress is not None else last
        self._progress[key] = (time.monotonic(), progress)
        return progress

    async def _apply(self, observed: Observed, actions: Actions) -> float | None:
        """Apply the pass; returns when to try again if the API server refused a create (else None)."""
        meta = observed.job["metadata"]
        if actions.issue_credentials:  # before any pod: a pod mounts it
            await issue_credentials(self.cluster, self.identity, observed.job)
            key = (meta.get("namespace") or "default", meta["name"], str(meta.get("uid") or ""))
            self._credentials_seen[key] = time.monotonic()
        job = (meta.get("namespace") or "default", meta["name"])
        attempts = self._refused.get(job, 0) + 1
        retry_in = refused_retry(
            attempts, self.settings.backoff_base_seconds, self.settings.backoff_max_seconds
        )

        def refused_status(refusals: list[Refusal]) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
            return with_refusals(actions.status, refusals, attempts, retry_in, observed.now)

        if await apply(self.cluster, observed, actions, refused_status):
            self._refused[job] = attempts
            self.metrics.errors.labels(kind="CreateRefused").inc()
            return retry_in
        self._refused.pop(job, None)
        return None

    async def reconcile_once(self, namespace: str, name: str, *, light: bool = False) -> float:
        """One level-based pass; returns how long to wait before the next one.

        `light`: from the last observation and fresh progress (`_progress_only`); if that asks for more than
        status and events, the pass observes the cluster properly before acting."""
        started = time.monotonic()
        try:
            observed = await self._progress_only(namespace, name) if light else None
            actions = decide(observed, self.settings) if observed is not None else None
            if actions is None or actions.changes_children:
                observed = await self.observe(namespace, name)
                if observed is None:
                    return self.settings.resync_seconds
                actions = decide(observed, self.settings)
            refused_retry_in = await self._apply(observed, actions)
            applied = {**observed.job, "status": actions.status}
            self._observed[(namespace, name)] = replace(observed, job=applied)
        except Exception as exc:  # a failed pass must not silence the job's loop: log it and try again
            failure = classify(exc, self.settings.resync_seconds)
            self.metrics.errors.labels(kind=failure.kind).inc()
            self.metrics.reconciles.labels(result="error").inc()
            self.metrics.pass_failed(f"{failure.kind}: {exc}")
            where = {"job": name, "namespace": namespace}
            if failure.from_cluster:
                log.warning("reconcile failed: %s", exc, extra=where)
            else:
                log.exception("reconcile crashed", extra=where)
            return failure.retry_after
        finally:
            self.metrics.latency.observe(time.monotonic() - started)
            self.metrics.pass_finished()
        self.metrics.reconciles.labels(result="ok").inc()
        self.metrics.pass_succeeded()
        self.metrics.job_phase(namespace, name, actions.status.get("phase"))
        self.first_reconciled.setdefault((namespace, name), time.time())
        if actions.create or actions.delete or actions.patch:
            log.info(
                "reconciled: %s",
                actions.summary(),
                extra={"job": name, "namespace": namespace, "phase": actions.status.get("phase")},
            )
        wait = self.settings.resync_seconds
        if actions.requeue_after is not None:
            wait = min(wait, max(actions.requeue_after, 0.05))
        if actions.create or actions.delete:
            wait = min(wait, 0.5)  # look again soon: confirm what was applied
        if self._progress.get((namespace, name)) is not None:
            wait = min(wait, self.status_interval)  # a coordinator is running: keep progress fresh
        if refused_retry_in is not None:
            wait = refused_retry_in  # what was refused is not asked for again until its backoff ends
        return wait

    def spec_changed(self, namespace: str, name: str, body: Mapping[str, Any]) -> bool:
        digest = json.dumps(
            [body.get("spec"), (body.get("metadata") or {}).get("deletionTimestamp")],
            sort_keys=True,
            default=str,
        )
        key = (namespace, name)
        changed = self._spec_seen.get(key) != digest
        self._spec_seen[key] = digest
        return changed

    async def forget(self, namespace: str, name: str) -> None:
        self.wakeups.forget(namespace, name)
        self._progress.pop((namespace, name), None)
        self._observed.pop((namespace, name), None)
        self._spec_seen.pop((namespace, name), None)
        self._refused.pop((namespace, name), None)
        for key in [k for k in self._credentials_seen if k[:2] == (namespace, name)]:
            del self._credentials_seen[key]
        self.metrics.job_phase(namespace, name, None)
        await self.coordinator.forget(name, namespace)
