"""API discovery: which resources the API server serves in a group version. Discovery is readable by
every authenticated client, so asking needs no RBAC of its own: what the health probe uses to tell that
the API answers and still serves RLHFJobs. Opening a watch of them (and closing it at once) is what tells
that kopf's watch can work: the same credentials, the same request.

lightkube has verbs for objects, not for discovery documents; this is one GET on an httpx2 client that
lightkube's own adapter sets up from the same config (server, TLS, credentials)."""

from __future__ import annotations

import httpx2
from lightkube import KubeConfig
from lightkube.config.client_adapter import AsyncClient, ConnectionParams

from dverl_operator.kube.client import REQUEST_TIMEOUT_SECONDS
from dverl_operator.kube.errors import translate_errors


class Discovery:
    """Its own connection, so the health probe never queues behind reconcile traffic."""

    def __init__(self, config: KubeConfig, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        params = ConnectionParams(timeout=httpx2.Timeout(timeout), trust_env=False)
        self._client = AsyncClient(config.get(), params)

    async def close(self) -> None:
        await self._client.aclose()

    async def resources(self, group: str, version: str) -> set[str]:
        """The plural names the server serves in `group/version`; kube.errors' ApiError or ApiUnreachable
        when it does not answer so."""
        async with translate_errors():
            response = await self._client.get(f"apis/{group}/{version}")
            response.raise_for_status()
            found = response.json()
        return {r.get("name") for r in (found.get("resources") or []) if isinstance(r, dict)}

    async def watch_opens(self, group: str, version: str, plural: str, namespace: str | None) -> None:
        """Open a watch of `plural` (in `namespace`, or across the cluster) as kopf's does, with these
        credentials, and close it at once: raises kube.errors' ApiError when the server refuses it (RBAC
        taken away, the resource gone, an error of its own), ApiUnreachable when it does not answer."""
        where = f"namespaces/{namespace}/" if namespace else ""
        params = {"watch": "true", "timeoutSeconds": "1", "allowWatchBookmarks": "true"}
        async with (
            translate_errors(),
            self._client.stream("GET", f"apis/{group}/{version}/{where}{plural}", params=params) as answer,
        ):
            if answer.status_code >= 400:
                await answer.aread()
            answer.raise_for_status()
