"""The two ways an API call fails, as the operator's callers see them, whatever the client underneath:
the server answered with an error (`ApiError`, with its HTTP status, reason and message), or it could not
be reached in time (`ApiUnreachable`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2


class ApiError(Exception):
    """A non-2xx answer from the API server, with its HTTP status and Kubernetes reason."""

    def __init__(self, status: int, method: str, path: str, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{method} {path}: HTTP {status} {reason}: {message}")

    @classmethod
    def from_answer(cls, status: int, method: str, path: str, payload: Any, fallback_reason: str) -> ApiError:
        """From the answer's body: a Kubernetes Status object (reason, message), or whatever text came."""
        body = payload if isinstance(payload, dict) else {}
        return cls(
            status,
            method,
            path,
            str(body.get("reason") or fallback_reason),
            str(body.get("message") or ""),
        )


class ApiUnreachable(ConnectionError):
    """No answer: the connection failed or timed out (an OSError, as socket failures are)."""


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """lightkube raises its ApiError for a JSON Status answer and httpx2's status error for any other
    body (an emulator's, a proxy's); both become kube.errors.ApiError, and a transport failure (refused,
    reset, timed out) ApiUnreachable."""
    try:
        yield
    except httpx2.HTTPStatusError as exc:
        response = exc.response
        try:
            payload: Any = response.json()
        except ValueError:
            payload = {"message": response.text[:500]}
        raise ApiError.from_answer(
            response.status_code,
            exc.request.method,
            exc.request.url.path.lstrip("/"),
            payload,
            response.reason_phrase,
        ) from exc
    except httpx2.TransportError as exc:
        raise ApiUnreachable(f"{type(exc).__name__}: {exc}") from exc
