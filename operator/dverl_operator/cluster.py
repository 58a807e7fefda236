"""Kubernetes API I/O: a small aiohttp client for the objects the operator reads and writes.

kopf already speaks to the API with aiohttp; this client uses the same credentials (kopf's own login
functions resolve in-cluster service accounts and kubeconfigs) for the few verbs the reconcile loop
needs, so the operator does not carry a second, heavier Kubernetes client library.
Label selectors are sent to the server and applied again here, so a server that ignores them (an
emulator) gives the same answer as one that honours them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from decentralized_verl.spec import API_GROUP, API_VERSION, PLURAL

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# kind -> (API prefix, plural)
KINDS: dict[str, tuple[str, str]] = {
    "Pod": ("api/v1", "pods"),
    "Service": ("api/v1", "services"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Secret": ("api/v1", "secrets"),
    "NetworkPolicy": ("apis/networking.k8s.io/v1", "networkpolicies"),
    "Event": ("api/v1", "events"),
    "Lease": ("apis/coordination.k8s.io/v1", "leases"),
    "RLHFJob": (f"apis/{API_GROUP}/{API_VERSION}", PLURAL),
    # Two API groups serve a kind named PodGroup: keyed by kind and group (gang.KIND_KEYS).
    "PodGroup.scheduling.x-k8s.io": ("apis/scheduling.x-k8s.io/v1alpha1", "podgroups"),
    "PodGroup.scheduling.volcano.sh": ("apis/scheduling.volcano.sh/v1beta1", "podgroups"),
}


def kind_key(obj: Mapping[str, Any]) -> str:
    """The KINDS key of an object: its kind, or `kind.group` where the kind alone is ambiguous."""
    kind = obj["kind"]
    if kind in KINDS:
        return kind
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    return f"{kind}.{group}"


class ApiError(Exception):
    """A non-2xx answer from the API server, with its HTTP status and Kubernetes reason."""

    def __init__(self, status: int, method: str, path: str, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{method} {path}: HTTP {status} {reason}: {message}")


def load_connection(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """--kubeconfig PATH, else the in-cluster service account, else the default kubeconfig."""
    settings = kopf.OperatorSettings()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads the same file
        info = kopf.login_with_kubeconfig(settings=settings)
    else:
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
            settings=settings
        )
    if info is None:
        raise kopf.LoginError("no Kubernetes credentials: not in a cluster and no kubeconfig found")
    return info


def _material(path: Any, data: Any, directory: str, name: str) -> str | None:
    """A file path for certificate material given as a path or as base64 data (kubeconfig style)."""
    if path:
        return os.fspath(path) if not isinstance(path, bytes) else path.decode()
    if not data:
        return None
    raw = base64.b64decode(data)
    target = os.path.join(directory, name)
    with open(target, "wb") as handle:
        handle.write(raw)
    return target


def ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | None:
    if not info.server.startswith("https"):
        return None
    context = ssl.create_default_context()
    with tempfile.TemporaryDirectory(prefix="dverl-tls-") as directory:
        ca = _material(info.ca_path, info.ca_data, directory, "ca.crt")
        if ca:
            context.load_verify_locations(cafile=ca)
        cert = _material(info.certificate_path, info.certificate_data, directory, "client.crt")
        key = _material(info.private_key_path, info.private_key_data, directory, "client.key")
        if cert:
            context.load_cert_chain(cert, key)
    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


@dataclass
class _Token:
    value: str | None
    read_at: float = 0.0

    def current(self) -> str | None:
        """Service-account tokens rotate on disk; re-read them every minute."""
        if os.path.exists(SERVICE_ACCOUNT_TOKEN) and time.monotonic() - self.read_at > 60:
            with open(SERVICE_ACCOUNT_TOKEN, encoding="utf-8") as handle:
                self.value = handle.read().strip() or self.value
            self.read_at = time.monotonic()
        return self.value


def matches(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


class Cluster:
    """The verbs the operator uses: get, list (by labels), create, patch, replace, delete."""

    def __init__(self, info: kopf.ConnectionInfo, user_agent: str = "dverl-operator") -> None:
        self.info = info
        self.server = info.server.rstrip("/")
        self._token = _Token(info.token)
        self._ssl = ssl_context(info)
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=32),
                timeout=aiohttp.ClientTimeout(total=30),
                headers={"User-Agent": self._user_agent, "Accept": "application/json"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    def path(
        kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None
    ) -> str:
        prefix, plural = KINDS[kind]
        parts = [prefix]
        if namespace:
            parts += ["namespaces", namespace]
        parts.append(plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type} if body is not None else {}
        token = self._token.current()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.info.username and self.info.password:
            basic = base64.b64encode(f"{self.info.username}:{self.info.password}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        url = f"{self.server}/{path}"
        async with self._client().request(method, url, params=params, json=body, headers=headers) as resp:
            try:
                payload = await resp.json(content_type=None)
            except (aiohttp.ContentTypeError, ValueError):
                payload = {"message": (await resp.text())[:500]}
            if resp.status >= 400:
                payload = payload if isinstance(payload, dict) else {}
                raise ApiError(
                    resp.status,
                    method,
                    path,
                    str(payload.get("reason") or resp.reason),
                    str(payload.get("message") or ""),
                )
            return payload if isinstance(payload, dict) else {}

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", self.path(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        selector = dict(labels or {})
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())} if selector else None
        payload = await self.request("GET", self.path(kind, namespace), params=params)
        items = payload.get("items") or []
        return [item for item in items if matches((item.get("metadata") or {}).get("labels"), selector)]

    async def create(self, kind: str, namespace: str | None, body: Mapping[str, Any]) -> bool:
        """Create; False (not an error) when it already exists, which makes creation idempotent."""
        try:
            await self.request("POST", self.path(kind, namespace), body=body)
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any] | None:
        """JSON merge patch; None when the object is gone."""
        try:
            return await self.request(
                "PATCH",
                self.path(kind, namespace, name, subresource),
                body=patch,
                content_type="application/merge-patch+json",
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def replace(
        self, kind: str, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """PUT: with metadata.resourceVersion set, a real API server refuses a stale write (409)."""
        return await self.request("PUT", self.path(kind, namespace, name), body=body)

    async def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        """Delete; False (not an error) when it was already gone."""
        try:
            await self.request("DELETE", self.path(kind, namespace, name))
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise


async def gather_limited(coros: list[Any], limit: int = 16) -> list[Any]:
    """Run API calls concurrently but not all at once (a large job has hundreds of pods)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Any) -> Any:
        async with semaphore:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
