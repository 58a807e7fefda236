"""Span servers over Hivemind's P2P streams: a volunteer serves a span as the job's span servers do over
gRPC, on the carrier today's volunteer work uses (`transport.p2p`), so it needs no inbound port.

The service is the same (`server.span_methods`: Forward, Close, Info, Stage, Commit, raw bytes), each
method a libp2p protobuf handler named `dverl.Span/<Method>` carrying `BytesValue`s. A reply's first byte
says how the call went: 0 and the answer, or 1 and a JSON `{"code", "details"}` with the gRPC status
name the front sorts failures by. A handler serves only the peers it was told to trust (the fronts it
serves; libp2p authenticates peer ids), so no one else can read its activations or load its weights.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Collection
from typing import Any

import grpc
from google.protobuf.wrappers_pb2 import BytesValue

from decentralized_verl.runtime import compute_thread
from decentralized_verl.spans.client import SpanCalls, SpanFailure, failure
from decentralized_verl.spans.server import SERVICE, SpanServer, span_methods, status_of
from decentralized_verl.transport.p2p import peer

log = logging.getLogger(__name__)

OK, FAILED = b"\x00", b"\x01"


def handler_name(method: str) -> str:
    return f"{SERVICE}/{method}"


def _failed(code: str, details: str) -> Any:
    return BytesValue(value=FAILED + json.dumps({"code": code, "details": details}).encode())


async def serve_span_p2p(p2p: Any, server: SpanServer, fronts: Collection[str]) -> None:
    """Register the span service on `p2p`, answering only the peers in `fronts` (base58 peer ids)."""
    allowed = frozenset(fronts)

    def wrap(method: str, fn: Any) -> Any:
        async def call(request: BytesValue, context: Any) -> BytesValue:
            caller = context.remote_id.to_base58()
            if caller not in allowed:
                details = f"peer {caller} is not a front this span serves"
                return BytesValue(
                    value=FAILED + json.dumps({"code": "PERMISSION_DENIED", "details": details}).encode()
                )
            try:
                return BytesValue(value=OK + await compute_thread.run(fn, request.value))
            except Exception as exc:
                code = status_of(exc)
                if code == "INTERNAL":
                    log.exception("%s: span call %s failed", server.server_id, method)
                details = str(exc) if code != "INTERNAL" else f"{type(exc).__name__}: {exc}"
                return BytesValue(
                    value=FAILED + json.dumps({"code": code, "details": details[:2000]}).encode()
                )

        return call

    for method, fn in span_methods(server).items():
        await p2p.add_protobuf_handler(handler_name(method), wrap(method, fn), BytesValue)


class P2PSpanClient(SpanCalls):
    """A span served by a peer over P2P; blocking calls run on the event loop that owns `p2p`.

    Untrusted by default (a volunteer): the front spot-checks its outputs. A call that times out or
    cannot reach the peer is a replaceable failure (UNAVAILABLE / DEADLINE_EXCEEDED), as over gRPC."""

    def __init__(
        self,
        p2p: Any,
        peer_id: str,
        loop: asyncio.AbstractEventLoop,
        *,
        timeout_s: float = 60.0,
        trusted: bool = False,
    ) -> None:
        self.p2p, self.peer_id, self.loop = p2p, peer_id, loop
        self.address = f"p2p:{peer_id}"
        self.timeout_s = timeout_s
        self.trusted = trusted

    def _call(self, method: str, data: bytes, timeout_s: float | None = None) -> bytes:
        timeout = timeout_s or self.timeout_s
        call = self.p2p.call_protobuf_handler(
            peer(self.peer_id), handler_name(method), BytesValue(value=data), BytesValue
        )
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(call, timeout), self.loop)
        try:
            reply = future.result(timeout + 5.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            raise SpanFailure(
                self.address, grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: no answer in {timeout:g}s"
            ) from None
        except Exception as exc:  # the peer is gone or unreachable (hivemind's own error types)
            raise SpanFailure(self.address, grpc.StatusCode.UNAVAILABLE, f"{method}: {exc}") from None
        status, body = reply.value[:1], reply.value[1:]
        if status == OK:
            return body
        try:
            error = json.loads(body)
            code = grpc.StatusCode[error["code"]]
            details = str(error["details"])
        except (ValueError, KeyError, TypeError):
            code, details = grpc.StatusCode.INTERNAL, f"malformed error reply {body[:80]!r}"
        raise failure(self.address, method, code, details)
