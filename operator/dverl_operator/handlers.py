"""kopf handlers, kept thin: one daemon per RLHFJob runs the level-based reconcile loop.

Each pass reads the job and its children from the API, asks the pure `reconcile.decide` what to do,
applies that, and writes `.status` through the status subresource only when it changed. Pod and job
watch events merely wake the job's loop early; a resync interval catches anything a watch missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import kopf

from decentralized_verl.core.status import JobStatus
from decentralized_verl.spec import API_GROUP, API_VERSION, KIND, PLURAL
from dverl_operator import children as kids
from dverl_operator import gang, owned, reconcile
from dverl_operator import guard_children as guard
from dverl_operator import status as st
from dverl_operator.cluster import ApiError, Cluster, gather_limited, kind_key
from dverl_operator.coordinator import CoordinatorClient
from dverl_operator.identity import OperatorIdentity
from dverl_operator.metrics import Metrics

log = logging.getLogger(__name__)
DEBOUNCE_SECONDS = 0.2
CREDENTIALS_RECHECK_SECONDS = 300.0


@dataclass
class Wakeups:
    """One asyncio.Event per job: watch events set it, the job's loop waits on it."""

    events: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    def get(self, namespace: str, name: str) -> asyncio.Event:
        return self.events.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.events.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self.events.pop((namespace, name), None)


@dataclass
class Runtime:
    """What the handlers share (passed to kopf as `memo`)."""

    cluster: Cluster
    settings: reconcile.Settings
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
    _observed: dict[tuple[str, str], reconcile.Observed] = field(default_factory=dict)
    """Each job's last full observation, its status as the last pass left it."""
    _slots: asyncio.Semaphore | None = None

    async def reconcile_when_free(self, namespace: str, name: str, *, light: bool = False) -> float:
        """A pass, once one of `max_concurrent` slots is free: many jobs never flood the API server."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        async with self._slots:
            return await self.reconcile_once(namespace, name, light=light)

    async def _progress_only(self, namespace: str, name: str) -> reconcile.Observed | None:
        """The last full observation with fresh coordinator progress, without reading the API server:
        between full passes (which run on every watch event of the job or its pods, and at each resync)
        only progress changes, so polling it must not cost each job six API reads every few seconds."""
        cached = self._observed.get((namespace, name))
        if cached is None:
            return None
        uid = str(cached.job["metadata"].get("uid") or "")
        progress = await self._poll(namespace, name, uid, cached.pods)
        return replace(
            cached,
            progress=progress,
            now=time.time(),
            credentials_ready=self._credentials_fresh(namespace, name, uid),
        )

    async def observe(self, namespace: str, name: str) -> reconcile.Observed | None:
        job = await self.cluster.get("RLHFJob", namespace, name)
        if job is None:
            return None
        policies = self.settings.network_policy is not None
        pods, config_map, service, gateway, policy, gateway_policy = await asyncio.gather(
            self.cluster.list("Pod", namespace, {owned.LABEL_JOB: name}),
            self.cluster.get("ConfigMap", namespace, kids.config_map_name(name)),
            self.cluster.get("Service", namespace, kids.service_name(name)),
            self.cluster.get("Service", namespace, kids.gateway_name(name)),
            self._maybe_get(policies, "NetworkPolicy", namespace, guard.network_policy_name(name)),
            self._maybe_get(policies, "NetworkPolicy", namespace, guard.gateway_policy_name(name)),
        )
        pods_by_name = {p["metadata"]["name"]: p for p in pods}
        pod_groups = await self._pod_groups(namespace, name)
        uid = str(job["metadata"].get("uid") or "")
        progress = await self._poll(namespace, name, uid, pods_by_name)
        return reconcile.Observed(
            job=job,
            pods=pods_by_name,
            config_map=config_map,
            service=service,
            progress=progress,
            now=time.time(),
            gateway=gateway,
            policies=(policy, gateway_policy),
            credentials_ready=self._credentials_fresh(namespace, name, uid),
            pod_groups=pod_groups,
        )

    async def _pod_groups(self, namespace: str, name: str) -> dict[str, dict[str, Any] | None]:
        """The job's PodGroup under each gang scheduler the chart enabled (and granted access to)."""
        schedulers = sorted(self.settings.gang_schedulers)
        found = await asyncio.gather(
            *(self.cluster.get(gang.KIND_KEYS[s], namespace, gang.group_name(name)) for s in schedulers)
        )
        return dict(zip(schedulers, found, strict=True))

    async def _maybe_get(self, wanted: bool, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """With NetworkPolicies turned off the operator is granted no access to them: it does not look
        (policies it made earlier stay until the job goes)."""
        return await self.cluster.get(kind, namespace, name) if wanted else None

    def _credentials_fresh(self, namespace: str, name: str, uid: str) -> bool:
        """Known to exist within the last few minutes; after that, one create (409: still there) confirms
        it again, so a Secret deleted by hand is made anew before a restarted pod needs it. The operator
        never reads a job's Secret."""
        seen = self._credentials_seen.get((namespace, name, uid))
        return seen is not None and time.monotonic() - seen < CREDENTIALS_RECHECK_SECONDS

    async def _issue_credentials(self, job: Mapping[str, Any]) -> None:
        meta = job["metadata"]
        namespace, name, uid = meta.get("namespace") or "default", meta["name"], str(meta.get("uid") or "")
        owner = owned.Owner(name=name, namespace=namespace, uid=uid)
        credentials = await asyncio.to_thread(self.identity.job_credentials, namespace, name, uid)
        created = await self.cluster.create("Secret", namespace, guard.credentials_secret(owner, credentials))
        if created:
            log.info("issued the job's credentials", extra={"job": name, "namespace": namespace})
        self._credentials_seen[(namespace, name, uid)] = time.monotonic()

    async def _poll(self, namespace: str, name: str, uid: str, pods: Mapping[str, Any]) -> JobStatus | None:
        """The coordinator's progress, at most every status_interval; only once learner 0 runs."""
        learner0 = pods.get(f"{name}-learner-0")
        if learner0 is None or st.pod_phase(learner0) != "Running":
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

    async def apply(self, observed: reconcile.Observed, actions: reconcile.Actions) -> None:
        job = observed.job
        namespace, name = job["metadata"].get("namespace") or "default", job["metadata"]["name"]
        if actions.issue_credentials:  # before any pod: a pod mounts it
            await self._issue_credentials(job)
        await gather_limited(
            [self.cluster.patch(kind, namespace, obj, patch) for kind, obj, patch in actions.patch]
        )
        await gather_limited([self.cluster.delete(kind, namespace, obj) for kind, obj in actions.delete])
        created = await gather_limited(
            [self.cluster.create(kind_key(o), namespace, o) for o in actions.create]
        )
        if actions.create and not all(created):
            log.info("some children already existed", extra={"job": name, "namespace": namespace})
        for kind, reason, message in actions.events:
            await self.event(job, kind, reason, message)
        patch = st.merge_patch(job.get("status") or {}, actions.status)
        if patch:
            await self.cluster.patch("RLHFJob", namespace, name, {"status": patch}, subresource="status")

    async def event(self, job: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the RLHFJob, so `kubectl describe rlhfjob` explains what happened."""
        meta = job["metadata"]
        namespace = meta.get("namespace") or "default"
        now = st.timestamp(time.time())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": KIND,
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "dverl-operator"},
            "reportingComponent": "dverl-operator",
        }
        try:
            await self.cluster.create("Event", namespace, body)
        except ApiError as exc:  # events are best effort
            log.warning("could not post event: %s", exc)

    async def reconcile_once(self, namespace: str, name: str, *, light: bool = False) -> float:
        """One level-based pass; returns how long to wait before the next one.

        `light`: from the last observation and fresh progress (`_progress_only`); if that asks for more than
        status and events, the pass observes the cluster properly before acting."""
        started = time.monotonic()
        try:
            observed = await self._progress_only(namespace, name) if light else None
            actions = reconcile.decide(observed, self.settings) if observed is not None else None
            if actions is None or actions.changes_children:
                observed = await self.observe(namespace, name)
                if observed is None:
                    return self.settings.resync_seconds
                actions = reconcile.decide(observed, self.settings)
            await self.apply(observed, actions)
            applied = {**observed.job, "status": actions.status}
            self._observed[(namespace, name)] = replace(observed, job=applied)
        except (TimeoutError, ApiError, OSError, aiohttp.ClientError) as exc:
            self.metrics.errors.labels(kind=type(exc).__name__).inc()
            self.metrics.reconciles.labels(result="error").inc()
            log.warning("reconcile failed: %s", exc, extra={"job": name, "namespace": namespace})
            return min(2.0, self.settings.resync_seconds)
        except Exception as exc:  # a bug must not silence the job's loop: log it and try again later
            self.metrics.errors.labels(kind=type(exc).__name__).inc()
            self.metrics.reconciles.labels(result="error").inc()
            log.exception("reconcile crashed", extra={"job": name, "namespace": namespace})
            return self.settings.resync_seconds
        finally:
            self.metrics.latency.observe(time.monotonic() - started)
            self.metrics.pass_finished()
        self.metrics.reconciles.labels(result="ok").inc()
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
        for key in [k for k in self._credentials_seen if k[:2] == (namespace, name)]:
            del self._credentials_seen[key]
        self.metrics.job_phase(namespace, name, None)
        await self.coordinator.forget(name, namespace)


def build_registry() -> kopf.OperatorRegistry:
    """A fresh registry with the operator's handlers (no global state: tests run several operators)."""
    registry = kopf.OperatorRegistry()

    @kopf.daemon(API_GROUP, API_VERSION, PLURAL, registry=registry, cancellation_timeout=2.0)
    async def run_job(
        name: str, namespace: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
    ) -> None:
        runtime: Runtime = memo.runtime
        wake = runtime.wakeups.get(namespace, name)
        stop = asyncio.ensure_future(stopped.wait())
        light = False
        full_at = 0.0
        try:
            while not stopped:
                wake.clear()
                if not light:
                    full_at = time.monotonic()
                delay = await runtime.reconcile_when_free(namespace, name, light=light)
                if stopped:
                    break
                # Let a burst of watch events (a pass creates several pods) coalesce into one pass.
                await asyncio.sleep(min(DEBOUNCE_SECONDS, delay))
                waiter = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait({waiter, stop}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                # A watch event or the resync interval: observe the cluster; else only progress is due.
                resync = runtime.settings.resync_seconds
                light = not wake.is_set() and time.monotonic() - full_at < resync
        finally:
            stop.cancel()
            await runtime.forget(namespace, name)

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def job_event(name: str, namespace: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        if runtime.spec_changed(namespace, name, body):
            runtime.wakeups.wake(namespace, name)

    @kopf.on.event("", "v1", "pods", labels={owned.LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def pod_event(labels: Mapping[str, str], namespace: str, memo: kopf.Memo, **_: Any) -> None:
        memo.runtime.wakeups.wake(namespace, labels[owned.LABEL_JOB])

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        return memo.runtime.cluster.info

    return registry
