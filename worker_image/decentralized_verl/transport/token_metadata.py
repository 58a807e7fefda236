"""The job token on every call a channel makes, attached by client interceptors in the calling thread.

Why not `grpc.access_token_call_credentials`: that is a metadata plugin, Python code which gRPC's own
threads call back into (to sign each call, and to drop the plugin when the channel goes away). Closing a
channel can then freeze the whole process: the closing thread holds the GIL while gRPC waits for its event
engine's threads to end, and one of them waits for the GIL to drop the plugin (grpc/grpc#42247, open in
the grpcio we pin). A process that opens and closes channels often, like `dverl run` polling the learner's
status, meets it sooner or later. Interceptors run in the caller, so gRPC never calls into Python for it.
"""

from __future__ import annotations

import collections
from typing import Any

import grpc

TOKEN_KEY = "authorization"


def bearer(token: bytes) -> str:
    return "Bearer " + token.decode()


def _with_token(metadata: Any, value: str) -> tuple[tuple[str, Any], ...]:
    kept = tuple((key, item) for key, item in (metadata or ()) if key != TOKEN_KEY)
    return (*kept, (TOKEN_KEY, value))


class _SyncDetails(
    collections.namedtuple(
        "_SyncDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class SyncToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """For `grpc.intercept_channel`: one object serves the four call shapes of a blocking channel."""

    def __init__(self, token: bytes) -> None:
        self.value = bearer(token)

    def _details(self, details: grpc.ClientCallDetails) -> _SyncDetails:
        return _SyncDetails(
            details.method,
            details.timeout,
            _with_token(details.metadata, self.value),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def _aio_details(details: grpc.aio.ClientCallDetails, value: str) -> grpc.aio.ClientCallDetails:
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        grpc.aio.Metadata(*_with_token(details.metadata, value)),
        details.credentials,
        details.wait_for_ready,
    )


class _AioToken:
    """What the four aio interceptors share: the token value they add."""

    def __init__(self, value: str) -> None:
        self.value = value


class _AioUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self.value), request)


class _AioUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self.value), request)


class _AioStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self.value), requests)


class _AioStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self.value), requests)


def aio_token(token: bytes) -> list[grpc.aio.ClientInterceptor]:
    """For `grpc.aio.secure_channel(..., interceptors=)`: the aio API takes one interceptor per call shape."""
    value = bearer(token)
    return [_AioUnaryUnary(value), _AioUnaryStream(value), _AioStreamUnary(value), _AioStreamStream(value)]
