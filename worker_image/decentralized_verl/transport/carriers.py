"""Carriers: the one thing gRPC and Hivemind P2P do differently for a role client, which is carry a
protobuf request to one worker and bring its reply (or its stream of replies) back.

Everything else a client does (building the request, validating the reply, naming the worker in a
failure) lives once, in `transport.clients`, over either carrier. A carrier reports a call that did not
come back as `CarrierError` with the transport's own reason (a gRPC status code and details, a P2P
timeout or handler error); it never judges the reply's content.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from decentralized_verl.core.interfaces import closed_under_us
from decentralized_verl.transport import secure
from decentralized_verl.transport.p2p import peer
from decentralized_verl.transport.rpc_errors import rpc_reason


@dataclass(frozen=True)
class Method:
    """One RPC of the wire contract, by its service and name."""

    service: str
    name: str

    @property
    def grpc_path(self) -> str:
        return f"/dverl.v1.{self.service}/{self.name}"

    @property
    def p2p_name(self) -> str:
        """The Hivemind P2P handler name (the same messages as the gRPC method)."""
        return f"dverl.{self.service}/{self.name}"


GENERATE = Method("Rollout", "Generate")
INFO = Method("Rollout", "Info")
SCORE = Method("Reward", "Score")
LOGPROBS = Method("Reference", "LogProbs")
VALUES = Method("Critic", "Values")
TRAIN = Method("Critic", "Train")
READY = Method("Health", "Ready")


class CarrierError(Exception):
    """A call that failed in transit; `reason` is the transport's account of it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Carrier(Protocol):
    worker_id: str
    """Names the worker in every failure a client reports."""

    async def unary(self, method: Method, request: Any, reply_type: type, timeout: float) -> Any: ...

    def stream(self, method: Method, request: Any, reply_type: type, timeout: float) -> AsyncIterator[Any]:
        """The replies as they arrive; the whole stream must end within `timeout` seconds."""
        ...

    async def close(self) -> None: ...


@contextlib.contextmanager
def _in_transit() -> Iterator[None]:
    """A gRPC call's failure as a CarrierError with gRPC's reason. A cancel that came from the channel
    being closed under the call is such a failure too; the waiting task's own cancel travels on."""
    try:
        yield
    except grpc.RpcError as exc:
        raise CarrierError(rpc_reason(exc)) from None
    except asyncio.CancelledError:
        if not closed_under_us():
            raise
        raise CarrierError("CANCELLED: the channel closed during the call") from None


class GrpcCarrier:
    """Calls over one gRPC channel to `address` (the in-cluster transport)."""

    def __init__(self, address: str, worker_id: str | None = None) -> None:
        self.address = address
        self.worker_id = worker_id or address
        self._channel = secure.aio_channel(address)

    async def unary(self, method: Method, request: Any, reply_type: type, timeout: float) -> Any:
        call = self._channel.unary_unary(
            method.grpc_path,
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply_type.FromString,
        )
        with _in_transit():
            return await call(request, timeout=timeout)

    async def stream(
        self, method: Method, request: Any, reply_type: type, timeout: float
    ) -> AsyncIterator[Any]:
        call = self._channel.unary_stream(
            method.grpc_path,
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply_type.FromString,
        )(request, timeout=timeout)
        try:
            with _in_transit():
                async for msg in call:
                    yield msg
        finally:
            call.cancel()  # no-op when the stream ended; stops the worker when the caller gave up early

    async def close(self) -> None:
        await self._channel.close()


class P2PCarrier:
    """Calls to one peer's stream handlers over Hivemind P2P (volunteers outside the cluster)."""

    def __init__(self, p2p: Any, peer_id: str, worker_id: str | None = None) -> None:
        self.p2p = p2p
        self.peer_id = peer_id
        self.worker_id = worker_id or peer_id

    def _peer(self) -> Any:
        return peer(self.peer_id)

    async def unary(self, method: Method, request: Any, reply_type: type, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(
                self.p2p.call_protobuf_handler(self._peer(), method.p2p_name, request, reply_type), timeout
            )
        except TimeoutError:
            raise CarrierError(f"no answer within {timeout:g}s") from None
        except Exception as exc:  # the peer vanished or its handler failed (hivemind's P2PHandlerError)
            raise CarrierError(f"{type(exc).__name__}: {exc}") from None

    async def stream(
        self, method: Method, request: Any, reply_type: type, timeout: float
    ) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            replies = await asyncio.wait_for(
                self.p2p.iterate_protobuf_handler(self._peer(), method.p2p_name, request, reply_type), timeout
            )
            while True:
                try:
                    msg = await asyncio.wait_for(anext(replies), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    return
                yield msg
        except TimeoutError:
            raise CarrierError(f"no complete answer within the {timeout:g}s deadline") from None
        except CarrierError:
            raise
        except Exception as exc:  # the peer vanished, refused the stream, or its handler failed
            raise CarrierError(f"P2P stream failed: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        return None
