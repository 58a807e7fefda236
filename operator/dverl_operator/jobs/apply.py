"""Apply what `decide` returned: the job's credentials first (a pod mounts them), then patches, deletions
and creations of children, the Events, and the job's `.status` through its subresource, written only
where it changed. A create the API server refuses (admission, quota, validation, a webhook) does not
fail the pass: it is returned, and the status written says it."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from decentralized_verl.spec import API_GROUP, API_VERSION, KIND
from dverl_operator.children import guard
from dverl_operator.jobs.identity import OperatorIdentity
from dverl_operator.kube.client import Cluster, gather_limited
from dverl_operator.kube.errors import ApiError
from dverl_operator.kube.kinds import kind_key
from dverl_operator.objects import owned
from dverl_operator.objects.owned import Owner
from dverl_operator.objects.times import timestamp
from dverl_operator.reconcile.actions import Actions
from dverl_operator.reconcile.observed import Observed
from dverl_operator.status.merge import merge_patch
from dverl_operator.status.refusals import Refusal, is_refusal

log = logging.getLogger(__name__)
RefusedStatus = Callable[[list[Refusal]], tuple[dict[str, Any], list[tuple[str, str, str]]]]


async def apply(
    cluster: Cluster,
    observed: Observed,
    actions: Actions,
    refused_status: RefusedStatus | None = None,
) -> list[Refusal]:
    """Children, Events and `.status` (credentials are issued before, by `issue_credentials`); returns
    the creates the API server refused. `refused_status(refusals)` turns them into the status and Events
    to write instead of `actions.status` (status/refusals.py); without it they are only returned."""
    job = observed.job
    namespace, name = job["metadata"].get("namespace") or "default", job["metadata"]["name"]
    await gather_limited([cluster.patch(kind, namespace, obj, patch) for kind, obj, patch in actions.patch])
    await gather_limited([cluster.delete(kind, namespace, obj) for kind, obj in actions.delete])
    answers = await gather_limited([_create(cluster, namespace, o) for o in actions.create])
    refusals = [a for a in answers if isinstance(a, Refusal)]
    if actions.create and any(a is False for a in answers):
        log.info("some children already existed", extra={"job": name, "namespace": namespace})
    status, events = actions.status, list(actions.events)
    if refused_status is not None:
        status, more = refused_status(refusals)
        events += more
    for kind, reason, message in events:
        await post_event(cluster, job, kind, reason, message)
    patch = merge_patch(job.get("status") or {}, status)
    if patch:
        await cluster.patch(KIND, namespace, name, {"status": patch}, subresource="status")
    actions.status = status
    return refusals


async def _create(cluster: Cluster, namespace: str, body: Mapping[str, Any]) -> bool | Refusal:
    """Create one child: True, False when it already exists, or the API server's refusal of it (an
    error of the server itself, or no answer, still fails the pass)."""
    try:
        return await cluster.create(kind_key(body), namespace, body)
    except ApiError as exc:
        if not is_refusal(exc.status):
            raise
        meta = body.get("metadata") or {}
        role = (meta.get("labels") or {}).get(owned.LABEL_ROLE)
        log.warning("create refused: %s", exc, extra={"namespace": namespace})
        return Refusal(
            str(body.get("kind")), str(meta.get("name")), role, exc.status, exc.reason, exc.message
        )


async def issue_credentials(cluster: Cluster, identity: OperatorIdentity, job: Mapping[str, Any]) -> None:
    """The job's credentials Secret, made from the operator's identity; one that exists is kept (the
    create answers 409), and the operator never reads it back."""
    meta = job["metadata"]
    namespace, name, uid = meta.get("namespace") or "default", meta["name"], str(meta.get("uid") or "")
    owner = Owner(name=name, namespace=namespace, uid=uid)
    credentials = await asyncio.to_thread(identity.job_credentials, namespace, name, uid)
    if await cluster.create("Secret", namespace, guard.credentials_secret(owner, credentials)):
        log.info("issued the job's credentials", extra={"job": name, "namespace": namespace})


def event_body(job: Mapping[str, Any], kind: str, reason: str, message: str, now: float) -> dict[str, Any]:
    """A core/v1 Event on the RLHFJob, so `kubectl describe rlhfjob` explains what happened."""
    meta = job["metadata"]
    namespace = meta.get("namespace") or "default"
    stamp = timestamp(now)
    return {
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
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": "dverl-operator"},
        "reportingComponent": "dverl-operator",
    }


async def post_event(cluster: Cluster, job: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """Best effort: an Event the API refuses is logged, never a failed pass."""
    body = event_body(job, kind, reason, message, time.time())
    try:
        await cluster.create("Event", body["metadata"]["namespace"], body)
    except ApiError as exc:
        log.warning("could not post event: %s", exc)
