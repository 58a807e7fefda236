"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

The holder renews `spec.renewTime` every `renew_seconds`; a candidate takes the Lease only when it is
absent or its holder has not renewed for `leaseDurationSeconds`. Writes carry the
observed resourceVersion, so on a real API server two candidates racing for an expired Lease cannot
both win (one gets 409). Each write is read back as well, for servers that do not check versions.
The decision of whether a Lease may be taken is the pure `may_acquire`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from dverl_operator.kube.client import Cluster
from dverl_operator.kube.errors import ApiError

log = logging.getLogger(__name__)
LEASE_NAME = "dverl-operator"


def identity_from_env() -> str:
    """POD_NAME (downward API) in a cluster; host and pid elsewhere."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    text = text.replace("Z", "+00:00")
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def may_acquire(lease: Mapping[str, Any] | None, identity: str, now: datetime.datetime) -> bool:
    """True when the Lease is free, ours, or its holder stopped renewing for a full lease duration."""
    if lease is None:
        return True
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    return renewed is None or (now - renewed).total_seconds() > duration


class LeaderElector:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.is_leader = False

    def _body(self, lease: Mapping[str, Any] | None, now: datetime.datetime) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        taking_over = spec.get("holderIdentity") != self.identity
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        version = ((lease or {}).get("metadata") or {}).get("resourceVersion")
        if version:
            metadata["resourceVersion"] = version
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_seconds)),
            renewTime=micro_time(now),
        )
        if taking_over:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; True when we hold it afterwards."""
        now = datetime.datetime.now(tz=datetime.UTC)
        try:
            lease = await self.cluster.get("Lease", self.namespace, self.name)
            if not may_acquire(lease, self.identity, now):
                return False
            body = self._body(lease, now)
            if lease is None:
                if not await self.cluster.create("Lease", self.namespace, body):
                    return False  # someone else created it first
            else:
                # A merge patch carrying metadata.resourceVersion is refused (409) by a real API server
                # when someone else wrote the Lease since we read it.
                await self.cluster.patch("Lease", self.namespace, self.name, body)
            check = await self.cluster.get("Lease", self.namespace, self.name)
        except (TimeoutError, ApiError, OSError) as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        return ((check or {}).get("spec") or {}).get("holderIdentity") == self.identity

    async def acquire(self) -> None:
        """Wait (as a follower) until this replica holds the Lease."""
        while not await self.try_acquire():
            await asyncio.sleep(self.renew_seconds)
        self.is_leader = True
        log.info("became leader", extra={"identity": self.identity, "lease": f"{self.namespace}/{self.name}"})

    async def hold(self) -> None:
        """Renew until a renewal has failed for a whole lease duration, then return (leadership lost)."""
        last_ok = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.renew_seconds)
            if await self.try_acquire():
                last_ok = asyncio.get_running_loop().time()
            elif asyncio.get_running_loop().time() - last_ok >= self.lease_seconds:
                self.is_leader = False
                log.error("lost leadership", extra={"identity": self.identity})
                return

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a follower takes over at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self.cluster.get("Lease", self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                await self.cluster.patch(
                    "Lease", self.namespace, self.name, {"spec": {"holderIdentity": None, "renewTime": None}}
                )
        except (TimeoutError, ApiError, OSError) as exc:
            log.warning("releasing lease: %s", exc)
