"""The sending half of the weight fan-out: one version streamed down a route of relays.

A `Session` is one version flowing through a node: the chunks verified so far (replayed to a child that
joins late) and a `Downstream` Push stream per child. A child that breaks or rejects the data is skipped
and its children adopted, so one broken worker never cuts off the others (see `transport.weights.relay`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

import grpc

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport.weights.publish import Published
from decentralized_verl.transport.weights.route import ROUTE_KEY, Hop, route_to_json
from decentralized_verl.transport.weights.service import WeightsServicer

if TYPE_CHECKING:
    from decentralized_verl.transport.weights.node import RelayNode

log = logging.getLogger(__name__)

SERVICE = "dverl.v1.Weights"
RESULT_KEY = "dverl-fanout-result"
OK = "ok"
REASON_CHARS = 200  # keeps trailing metadata well under gRPC's 8 KiB default limit


def identity(raw: bytes) -> bytes:
    return raw


def metadata_value(metadata: Iterable | None, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return None


# ------------------------------------------------------------------------------------------ sending


class HeldMessages(Sequence[bytes]):
    """A held version's chunks as serialized `WeightChunk` messages (the first carries the manifest), each
    made when read and not kept: a stream holds the messages it has in flight, never a serialized copy of
    the whole version beside the one buffer the publisher holds."""

    def __init__(self, held: Published) -> None:
        self.held = held

    def __len__(self) -> int:
        return len(self.held.bundle.chunks)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        chunk = self.held.bundle.chunks[index]
        return WeightsServicer.chunk_message(self.held, chunk, first=chunk.index == 0).SerializeToString()


Message = bytes | Callable[[], bytes]
"""A serialized chunk message, or what makes it when a stream is about to send it."""


# ------------------------------------------------------------------------------------------ fan-out


class Downstream:
    """One Push stream to a child, fed with verified serialized chunks as the session gets them (a message
    still to be made is made when the stream sends it)."""

    def __init__(self, session: Session, hop: Hop) -> None:
        self.session = session
        self.hop = hop
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue()
        for raw in session.backlog:
            self.queue.put_nowait(raw)
        if session.sealed:
            self.queue.put_nowait(None)
        self.call = None
        self.task = asyncio.ensure_future(self._run())

    async def _requests(self) -> AsyncIterator[bytes]:
        while (raw := await self.queue.get()) is not None:
            yield raw() if callable(raw) else raw

    async def _run(self) -> dict[str, str]:
        relay = self.session.relay
        push = relay.channel(self.hop.address).stream_unary(
            f"/{SERVICE}/Push", request_serializer=identity, response_deserializer=pb.PushAck.FromString
        )
        self.call = push(
            self._requests(),
            metadata=((ROUTE_KEY, route_to_json(self.hop.children)),),
            timeout=relay.timeout_s,
        )
        try:
            ack = await self.call
            subtree = metadata_value(await self.call.trailing_metadata(), RESULT_KEY)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
            ack, subtree = pb.PushAck(ok=False, reason=reason), None
        except asyncio.CancelledError:
            return {a: "cancelled" for a in self.hop.addresses()}
        results = {}
        if subtree:
            try:
                results = {str(k): str(v) for k, v in json.loads(subtree).items()}
            except (ValueError, AttributeError):
                results = {}
        results[self.hop.address] = OK if ack.ok else f"failed: {ack.reason}"[:REASON_CHARS]
        if not ack.ok:
            log.warning("fan-out: %s skipped (%s); adopting its children", self.hop.address, ack.reason)
            for child in self.hop.children:  # skip the broken node: its parent feeds its children
                if results.get(child.address) != OK:
                    self.session.open(child)
        return results

    def cancel(self) -> None:
        self.task.cancel()
        if self.call is not None:
            self.call.cancel()


@dataclass
class Session:
    """One version flowing through this node: the chunks verified so far and the children fed with them."""

    relay: RelayNode
    backlog: list[Message] = field(default_factory=list)
    downstreams: list[Downstream] = field(default_factory=list)
    sealed: bool = False

    def open(self, hop: Hop) -> None:
        self.downstreams.append(Downstream(self, hop))

    def send(self, raw: Message) -> None:
        self.backlog.append(raw)
        for d in self.downstreams:
            d.queue.put_nowait(raw)

    async def finish(self, timeout_s: float | None = None) -> dict[str, str]:
        """Seal the stream and wait for every child (and every adopted grandchild) to answer; a child that
        has not answered within ``timeout_s`` (a worker that hangs alive) is cancelled with its subtree."""
        self.sealed = True
        for d in self.downstreams:
            d.queue.put_nowait(None)
        loop = asyncio.get_running_loop()
        until = None if timeout_s is None else loop.time() + timeout_s
        results: dict[str, str] = {}
        seen = 0
        while seen < len(self.downstreams):  # adoption may open more while we wait
            d = self.downstreams[seen]
            left = None if until is None else max(0.0, until - loop.time())
            done, _ = await asyncio.wait({d.task}, timeout=left)
            if done:
                outcomes = d.task.result()
            else:
                d.cancel()
                log.warning("fan-out: %s gave no answer in %.0f s; cut off", d.hop.address, timeout_s)
                outcomes = {a: f"not sent: no answer in {timeout_s:.0f} s" for a in d.hop.addresses()}
            for address, outcome in outcomes.items():
                if results.get(address) != OK:
                    results[address] = outcome
            seen += 1
        return results

    def abort(self, hops: Iterable[Hop], reason: str) -> dict[str, str]:
        for d in self.downstreams:
            d.cancel()
        return {a: f"not sent: {reason}"[:REASON_CHARS] for h in hops for a in h.addresses()}
