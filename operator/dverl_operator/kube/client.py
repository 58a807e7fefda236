"""The verbs the operator uses (get, list by labels, create, merge patch, delete), over lightkube's async
client, on dict-shaped objects of every kind in kinds.py.

Each verb answers the way the reconcile loop wants it: a missing object is None or False rather than an
error, an object that already exists is False on create (so creation is idempotent), and every other
failure is one of kube.errors' two. Label selectors are sent to the server and applied again here, so a
server that ignores them (an emulator) gives the same answer as one that honours them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.types import PatchType

from dverl_operator.kube.errors import ApiError, translate_errors
from dverl_operator.kube.kinds import namespace_resource, resource

REQUEST_TIMEOUT_SECONDS = 30.0
T = TypeVar("T")


def matches(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


class Cluster:
    """One connection pool to the API server; each use that must never queue behind another (the Lease,
    the health probe) gets a Cluster of its own."""

    def __init__(self, config: KubeConfig, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.config = config
        self._client = AsyncClient(config, timeout=httpx2.Timeout(timeout), trust_env=False)

    @property
    def server(self) -> str:
        return self._client.config.cluster.server

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            async with translate_errors():
                return dict(await self._client.get(resource(kind), name, namespace=namespace))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """A namespace's labels ({} when it is gone): its Pod Security enforce label is read from them."""
        try:
            async with translate_errors():
                found = dict(await self._client.get(namespace_resource(), name))
        except ApiError as exc:
            if exc.status == 404:
                return {}
            raise
        return dict((found.get("metadata") or {}).get("labels") or {})

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        selector = dict(labels or {})
        async with translate_errors():
            items = [
                dict(item)
                async for item in self._client.list(
                    resource(kind), namespace=namespace, labels=selector or None
                )
            ]
        return [item for item in items if matches((item.get("metadata") or {}).get("labels"), selector)]

    async def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create; False (not an error) when it already exists, which makes creation idempotent."""
        try:
            async with translate_errors():
                await self._client.create(resource(kind)(body), namespace=namespace)
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    async def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any] | None:
        """JSON merge patch (of the object, or of its `status` subresource); None when the object is gone."""
        target = resource(kind)
        if subresource == "status":
            target = target.Status
        elif subresource is not None:
            raise ValueError(f"subresource {subresource!r}: only status is patched")
        try:
            async with translate_errors():
                found = await self._client.patch(
                    target, name, dict(patch), namespace=namespace, patch_type=PatchType.MERGE
                )
            return dict(found)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete; False (not an error) when it was already gone."""
        try:
            async with translate_errors():
                await self._client.delete(resource(kind), name, namespace=namespace)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise


async def gather_limited(calls: list[Awaitable[T]], limit: int = 16) -> list[T]:
    """Run API calls concurrently but not all at once (a large job has hundreds of pods)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with semaphore:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))
