"""kmock's Kubernetes emulator made as strict as an API server where the operator can tell the
difference. kmock stores objects and streams them; this subclass takes over every write and the watches:

- who asks: a bearer token names a user; a user other than the tests' own is authorized against RBAC
  (the chart's rendered roles, rbac.py) and refused with 403;
- every write gets a fresh resourceVersion from one counter; a write carrying a resourceVersion that is
  not the object's current one is refused with 409 Conflict; a write that changes nothing is not stored;
- uid, creationTimestamp and generation are the server's (generation moves when anything but metadata
  and status changes); `generateName` is honoured;
- the status subresource: writes to the object leave `.status` alone, writes to `/status` change only it;
- custom resources are pruned, defaulted and validated against their CRD's schema and CEL rules (422);
- pod creates pass admission (Pod Security for a labelled namespace, ResourceQuota; 403);
- lists and watches honour label and field selectors and carry resourceVersions; a watch resumed from a
  resourceVersion older than the history kept gets an ERROR event with 410 Gone; `timeoutSeconds` ends a
  watch; `compact` and `expire_watches` make the history short and the watches end, as etcd compaction
  and an API server restart do.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering

from tests.support.api_server import admission, schema, status
from tests.support.api_server.rbac import Authorizer, Request
from tests.support.api_server.selectors import field_selector, label_selector

ADMIN = "kubernetes-admin"
"""The user of a request without a token: the tests and the node harness, allowed everything."""
STATUS_KINDS = frozenset({"rlhfjobs", "pods", "podgroups", "resourcequotas", "namespaces"})
"""Resources served with a status subresource."""
TERMINAL = ("Succeeded", "Failed")


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what `application/merge-patch+json` means)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 (add, remove, replace, test), enough for what clients send."""
    doc = copy.deepcopy(target)
    for op in operations:
        steps = [s.replace("~1", "/").replace("~0", "~") for s in op["path"].split("/")[1:]]
        parent = doc
        for step in steps[:-1]:
            parent = parent[int(step)] if isinstance(parent, list) else parent[step]
        last = steps[-1] if steps else ""
        kind = op["op"]
        if kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op.get("value"):
                raise status.Refusal(422, "Invalid", f"the test operation failed at {op['path']}")
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op["value"])
            else:
                parent[index] = op["value"]
        else:
            parent[last] = op["value"]
    return doc


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What generation follows: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _without_version(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    (out.get("metadata") or {}).pop("resourceVersion", None)
    return out


@attrs.define(kw_only=True)
class StrictEmulator(kmock.KubernetesEmulator):
    schemas: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """A custom resource's structural schema by `plural.group` (rlhfjobs.dverl.io)."""
    authorizer: Authorizer | None = None
    tokens: dict[str, str] = attrs.field(factory=dict)
    """Bearer token -> user name; a request without a known token is the tests' admin."""
    history_limit: int = 5000
    """Watch events kept per server; a watch resumed from before them is 410 Gone."""

    _version: int = attrs.field(default=1, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _log: collections.deque[tuple[int, Any, dict[str, Any]]] = attrs.field(
        factory=collections.deque, init=False
    )
    _watch_ends: set[asyncio.Event] = attrs.field(factory=set, init=False)
    refusals: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    """Every refusal answered, newest last (what tests read to see that the world said no)."""
    pod_webhooks: list[Callable[[dict[str, Any]], None]] = attrs.field(factory=list, init=False)
    """Mutating admission for pods: each changes a new pod in place before it is validated and stored
    (a test installs Kueue's, tests/support/kueue_standin.py)."""

    # ------------------------------------------------------------------------------ public
    @property
    def resource_version(self) -> int:
        return self._version

    def compact(self) -> int:
        """Forget every watch event so far (etcd compaction): a watch resumed from any resourceVersion
        up to now gets 410 Gone. Returns the compacted revision."""
        self._log.clear()
        self._compacted = self._version
        return self._compacted

    async def store(self, resource: Any, body: dict[str, Any], checked: bool = True) -> dict[str, Any]:
        """Create an object as an admin's request would (for paths kmock cannot route, such as
        `POST /api/v1/namespaces`); raises the Refusal a request would get. `checked=False` skips schema
        and admission: an object stored before its CRD's schema tightened, which an API server keeps."""
        request = rendering.Request(
            method=enums.method.POST,
            action=enums.action.CREATE,
            resource=resource,
            namespace=(body.get("metadata") or {}).get("namespace"),
            data=body,
        )
        response = await self._create(request, checked)
        return json.loads(response.text or "{}")

    def expire_watches(self) -> None:
        """End every open watch (an API server restarting): clients resume from their last version."""
        for ended in list(self._watch_ends):
            ended.set()

    # ------------------------------------------------------------------------------ dispatch
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self._names_a_namespace(request):
            return self._get_namespace(request)
        if request.resource is None or not request.resource.plural:  # discovery: every user may read it
            return await super()._handle(request)
        try:
            self._authorize(request)
            if request.action == enums.action.CREATE:
                return await self._create(request)
            if request.action == enums.action.UPDATE and request.name is not None:
                return await self._update(request)
            if request.action == enums.action.DELETE and request.name is not None:
                return await self._delete(request)
        except status.Refusal as refusal:
            self.refusals.append(refusal.body)
            return aiohttp.web.json_response(refusal.body, status=refusal.code)
        return await super()._handle(request)

    @staticmethod
    def _names_a_namespace(request: rendering.Request) -> bool:
        """`GET /api/v1/namespaces/<n>`, which kmock reads as namespace <n> with no resource."""
        resource = request.resource
        return (
            request.method == enums.method.GET
            and bool(request.namespace)
            and resource is not None
            and resource.group == ""
            and not resource.plural
        )

    def _get_namespace(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """One Namespace by name, authorized as the API server files it: under that namespace."""
        name = request.namespace or ""
        try:
            if self.authorizer is not None and (user := self._user(request)) != ADMIN:
                self.authorizer.check(Request(user, "get", "", "namespaces", "", name, name))
            key = (kmock.resource("", "v1", "namespaces"), None, name)
            if key not in self._objects or self._objects[key].deleted:
                raise status.not_found("namespaces", "", name)
        except status.Refusal as refusal:
            self.refusals.append(refusal.body)
            return aiohttp.web.json_response(refusal.body, status=refusal.code)
        return aiohttp.web.json_response(self._objects[key].raw)

    def _user(self, request: rendering.Request) -> str:
        header = request.headers.get("Authorization") or request.headers.get("authorization") or ""
        token = header.removeprefix("Bearer ").strip()
        return self.tokens.get(token, ADMIN)

    def _authorize(self, request: rendering.Request) -> None:
        user = self._user(request)
        if self.authorizer is None or user == ADMIN:
            return
        verb = {
            enums.action.LIST: "list",
            enums.action.WATCH: "watch",
            enums.action.FETCH: "get",
            enums.action.CREATE: "create",
            enums.action.DELETE: "delete" if request.name else "deletecollection",
        }.get(request.action)  # type: ignore[arg-type]
        if request.action == enums.action.UPDATE:
            verb = "update" if request.method == enums.method.PUT else "patch"
        resource = request.resource
        assert resource is not None
        name = request.name or ""
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            name = (request.data.get("metadata") or {}).get("name") or ""
        self.authorizer.check(
            Request(
                user=user,
                verb=verb or "get",
                group=resource.group or "",
                resource=resource.plural or "",
                subresource=request.subresource or "",
                namespace=request.namespace or "",
                name=name,
            )
        )

    # ------------------------------------------------------------------------------ writes
    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    async def _emit(self, resource: Any, kind: str, obj: Mapping[str, Any]) -> None:
        raw = copy.deepcopy(dict(obj))
        version = int((raw.get("metadata") or {}).get("resourceVersion") or self._version)
        event = {"type": kind, "object": raw}
        self._log.append((version, resource, event))
        while len(self._log) > self.history_limit:
            dropped, _, _ = self._log.popleft()
            self._compacted = max(self._compacted, dropped)
        await self._buses[resource].put(event)

    def _schema(self, resource: Any) -> dict[str, Any] | None:
        return self.schemas.get(f"{resource.plural}.{resource.group}") if resource.group else None

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        key = (kmock.resource("", "v1", "namespaces"), None, namespace)
        if key in self._objects and not self._objects[key].deleted:
            return dict((self._objects[key].raw.get("metadata") or {}).get("labels") or {})
        return {}

    def _live(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        return [
            obj.raw
            for (resource, ns, _), obj in self._objects.items()
            if resource.plural == plural and not resource.group and ns == namespace and not obj.deleted
        ]

    async def _create(self, request: rendering.Request, checked: bool = True) -> aiohttp.web.StreamResponse:
        resource = request.resource
        assert resource is not None
        data = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = data.setdefault("metadata", {})
        namespace = request.namespace or meta.get("namespace")
        if namespace:
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
        name = meta.get("name") or ""
        kind = data.get("kind") or resource.plural
        if not name:
            error = schema.FieldError(
                "metadata.name", "FieldValueRequired", "Required value: name or generateName is required"
            )
            raise status.invalid(kind, resource.group or "", "", [error])
        async with self._lock:
            key = (resource, namespace, name)
            if key in self._objects and not self._objects[key].deleted:
                raise status.already_exists(resource.plural, resource.group or "", name)
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                meta.pop(field, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
            crd = self._schema(resource)
            if resource.plural in STATUS_KINDS and resource.plural != "namespaces":
                data.pop("status", None)
            if crd is not None:  # pruned and defaulted even unchecked, as reading it from storage does
                data, errors = schema.admit(data, crd)
                if errors and checked:
                    raise status.invalid(kind, resource.group, name, errors)
            if resource.plural == "pods" and not resource.group and checked:
                for webhook in self.pod_webhooks:
                    webhook(data)
                errors = admission.pod_errors(data)
                if errors:
                    raise status.invalid("Pod", "", name, errors)
                refusal = admission.refusal_of(
                    data,
                    self._namespace_labels(namespace or ""),
                    self._live("resourcequotas", namespace or ""),
                    self._live("pods", namespace or ""),
                )
                if refusal is not None:
                    raise refusal
                data["status"] = {"phase": "Pending"}
            meta["resourceVersion"] = self._next_version()
            if key in self._objects:
                self._objects[key].create(data)
            else:
                self._objects[key] = data
            stored = self._objects[key].raw
            await self._emit(resource, "ADDED", stored)
        return aiohttp.web.json_response(stored, status=201)

    async def _update(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        assert resource is not None and request.name is not None
        key = (resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise status.not_found(resource.plural, resource.group or "", request.name)
            current = copy.deepcopy(self._objects[key].raw)
            data = request.data
            content_type = request.headers.get("Content-Type") or request.headers.get("content-type") or ""
            if request.method == enums.method.PUT:
                candidate = copy.deepcopy(data)
            elif "json-patch" in content_type:
                candidate = json_patch(current, data)
            else:
                candidate = merge(current, data)
            sent = data.get("metadata", {}).get("resourceVersion") if isinstance(data, dict) else None
            if sent is None and isinstance(data, list):  # a JSON patch may test or set it
                sent = (candidate.get("metadata") or {}).get("resourceVersion")
                sent = (
                    sent
                    if sent != current["metadata"].get("resourceVersion")
                    or any(op.get("path") == "/metadata/resourceVersion" for op in data)
                    else None
                )
            if sent not in (None, "") and str(sent) != str(current["metadata"].get("resourceVersion")):
                raise status.conflict(resource.plural, resource.group or "", request.name)
            candidate = self._reconciled(resource, request.subresource, current, candidate)
            if resource.plural == "pods" and not resource.group and self._user(request) != ADMIN:
                errors = admission.pod_update_errors(current, candidate)
                if errors:
                    raise status.invalid("Pod", "", request.name, errors)
            crd = self._schema(resource)
            if crd is not None:
                candidate, errors = schema.admit(candidate, crd, old=current)
                if errors:
                    kind = current.get("kind") or resource.plural
                    raise status.invalid(kind, resource.group, request.name, errors)
            if _without_version(candidate) == _without_version(current):
                return aiohttp.web.json_response(current)
            candidate["metadata"]["resourceVersion"] = self._next_version()
            meta = candidate["metadata"]
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._objects[key].create(candidate)
                self._objects[key].delete()
                await self._emit(resource, "DELETED", candidate)
                return aiohttp.web.json_response(candidate)
            self._objects[key].create(candidate)
            await self._emit(resource, "MODIFIED", candidate)
        return aiohttp.web.json_response(candidate)

    def _reconciled(
        self, resource: Any, subresource: str | None, current: dict[str, Any], candidate: dict[str, Any]
    ) -> dict[str, Any]:
        """The candidate with what the client may not change put back: the server's metadata fields, the
        status (or everything but it, for `/status`), and generation moved when the body changed."""
        candidate = copy.deepcopy(candidate)
        if resource.plural in STATUS_KINDS:
            if subresource == "status":
                candidate = {**copy.deepcopy(current), "status": candidate.get("status")}
                if candidate["status"] is None:
                    candidate.pop("status")
            elif "status" in current:
                candidate["status"] = copy.deepcopy(current["status"])
            else:
                candidate.pop("status", None)
        old_meta, meta = current.get("metadata") or {}, candidate.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp", "generation"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        if _body(candidate) != _body(current):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1
        return candidate

    async def _delete(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        assert resource is not None and request.name is not None
        key = (resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise status.not_found(resource.plural, resource.group or "", request.name)
            current = copy.deepcopy(self._objects[key].raw)
            meta = current["metadata"]
            if meta.get("deletionTimestamp"):
                return aiohttp.web.json_response(current)
            meta["resourceVersion"] = self._next_version()
            if meta.get("finalizers"):
                meta["deletionTimestamp"] = _now()
                self._objects[key].create(current)
                await self._emit(resource, "MODIFIED", current)
            else:
                self._objects[key].delete()
                await self._emit(resource, "DELETED", current)
        return aiohttp.web.json_response(current)

    # ------------------------------------------------------------------------------ reads
    def _matcher(self, request: rendering.Request) -> Any:
        labels = label_selector(request.params.get("labelSelector"))
        fields = field_selector(request.params.get("fieldSelector"))

        def match(obj: Mapping[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if request.namespace is not None and meta.get("namespace") != request.namespace:
                return False
            if request.name is not None and meta.get("name") != request.name:
                return False
            return labels(meta.get("labels") or {}) and fields(obj)

        return match

    def _current(self, request: rendering.Request) -> list[dict[str, Any]]:
        match = self._matcher(request)
        return [
            obj.raw
            for (resource, _, _), obj in self._objects.items()
            if resource == request.resource and not obj.deleted and match(obj.raw)
        ]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._current(request)
            version = str(self._version)
        return {"metadata": {"resourceVersion": version}, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        resource = request.resource
        assert resource is not None
        match = self._matcher(request)
        since_text = request.params.get("resourceVersion") or ""
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        bus = self._buses[resource]
        async with self._lock:
            if since_text not in ("", "0"):
                since = int(since_text)
                if since < self._compacted:
                    gone = status.gone(since, self._compacted + 1).body
                    self.refusals.append(gone)
                    yield {"type": "ERROR", "object": gone}
                    return
                backlog = [e for v, r, e in self._log if r == resource and v > since and match(e["object"])]
            else:
                since = self._version
                backlog = [{"type": "ADDED", "object": obj} for obj in self._current(request)]
            mark = await bus.mark()
        ended = asyncio.Event()
        self._watch_ends.add(ended)
        try:
            for event in backlog:
                yield event
            async for event in self._until(bus.stream(since=mark), ended, timeout):
                version = int((event["object"].get("metadata") or {}).get("resourceVersion") or 0)
                if version > since and match(event["object"]):
                    yield event
        finally:
            self._watch_ends.discard(ended)
            await bus.unmark(mark)

    @staticmethod
    async def _until(
        stream: AsyncIterator[dict[str, Any]], ended: asyncio.Event, timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream's items until `ended` is set or `timeout` seconds pass."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        stop = asyncio.ensure_future(ended.wait())
        try:
            while True:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return
                item = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({item, stop}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if item not in done:
                    item.cancel()
                    return
                yield item.result()
        finally:
            stop.cancel()
