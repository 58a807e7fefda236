"""kopf handlers, kept thin: one daemon per RLHFJob runs the level-based reconcile loop (jobs/runtime.py);
pod and job watch events merely wake the job's loop early; a resync interval catches anything a watch
missed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import kopf

from decentralized_verl.spec import API_GROUP, API_VERSION, PLURAL
from dverl_operator.jobs.runtime import Runtime
from dverl_operator.objects.owned import LABEL_JOB

DEBOUNCE_SECONDS = 0.2


def build_registry(login: kopf.ConnectionInfo) -> kopf.OperatorRegistry:
    """A fresh registry with the operator's handlers (no global state: tests run several operators).
    `login`: what kopf's own watches connect with (the same credentials as the operator's client)."""
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

    @kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def pod_event(labels: Mapping[str, str], namespace: str, memo: kopf.Memo, **_: Any) -> None:
        memo.runtime.wakeups.wake(namespace, labels[LABEL_JOB])

    @kopf.on.login(registry=registry)
    def kopf_login(**_: Any) -> kopf.ConnectionInfo:
        return login

    return registry
