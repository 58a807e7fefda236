"""The API server's `Status` failures, with its codes, reasons and sentences: what a client (kopf,
lightkube, kubectl) reads and reports when a request is refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.support.api_server.schema import FieldError


class Refusal(Exception):
    """A request the API server refuses; `body` is the `Status` it answers with."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    @property
    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def qualified(plural: str, group: str) -> str:
    """`pods`, `rlhfjobs.dverl.io`: how the API server names a resource in its messages."""
    return f"{plural}.{group}" if group else plural


def invalid(kind: str, group: str, name: str, errors: Sequence[FieldError]) -> Refusal:
    """422 Invalid: every field error at once, as the API server lists them."""
    listed = [str(e) for e in errors]
    joined = listed[0] if len(listed) == 1 else f"[{', '.join(listed)}]"
    kind_name = f"{kind}.{group}" if group else kind
    return Refusal(
        422,
        "Invalid",
        f'{kind_name} "{name}" is invalid: {joined}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors],
        },
    )


def forbidden(plural: str, group: str, name: str, why: str) -> Refusal:
    """403 Forbidden (RBAC, admission): `pods "x" is forbidden: <why>`."""
    what = qualified(plural, group)
    subject = f'{what} "{name}"' if name else what
    return Refusal(
        403, "Forbidden", f"{subject} is forbidden: {why}", {"name": name, "group": group, "kind": plural}
    )


def conflict(plural: str, group: str, name: str) -> Refusal:
    """409 Conflict on a write carrying a resourceVersion that is not the object's current one."""
    what = qualified(plural, group)
    return Refusal(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {what} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "group": group, "kind": plural},
    )


def already_exists(plural: str, group: str, name: str) -> Refusal:
    what = qualified(plural, group)
    return Refusal(
        409,
        "AlreadyExists",
        f'{what} "{name}" already exists',
        {"name": name, "group": group, "kind": plural},
    )


def gone(requested: int, oldest: int) -> Refusal:
    """410 Gone for a watch resumed from a resourceVersion older than the history kept (etcd's compaction)."""
    return Refusal(410, "Expired", f"too old resource version: {requested} ({oldest})")


def not_found(plural: str, group: str, name: str) -> Refusal:
    what = qualified(plural, group)
    details = {"name": name, "group": group, "kind": plural}
    return Refusal(404, "NotFound", f'{what} "{name}" not found', details)
