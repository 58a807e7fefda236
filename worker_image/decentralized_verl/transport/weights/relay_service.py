"""The Weights service a relay answers: GetManifest, Fetch of what it holds, Push received and passed on,
and BulkOpen for the bulk plane.

This is the receiving, servicer side of `WeightRelay`, kept apart from the node's own state (the versions
it holds, its channels) so the relay reads as one thing. A Push is verified chunk by chunk and each chunk
forwarded to the children named in the call's route while the next ones arrive; the outcome for every
node of the subtree goes back in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights.bulk_plane import BULK_OPEN, BulkPlane
from decentralized_verl.transport.weights.node import RelayNode
from decentralized_verl.transport.weights.push import (
    RESULT_KEY,
    SERVICE,
    Session,
    identity,
    metadata_value,
)
from decentralized_verl.transport.weights.receive import BundleBuilder
from decentralized_verl.transport.weights.route import ROUTE_KEY, Hop, route_from_json
from decentralized_verl.transport.weights.service import WeightsServicer

log = logging.getLogger(__name__)


class ServedNode(RelayNode, Protocol):
    """A node whose Weights service also opens bulk transfers (`relay.WeightRelay`)."""

    bulk: BulkPlane


class RelayServicer:
    """The handlers of one relay's Weights service; `add_to_server` registers them."""

    def __init__(self, relay: ServedNode) -> None:
        self.relay = relay
        self._manifests = WeightsServicer(relay.publisher)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        handlers = {
            "GetManifest": grpc.unary_unary_rpc_method_handler(
                self._manifests.GetManifest,
                request_deserializer=pb.ManifestRequest.FromString,
                response_serializer=pb.WeightManifest.SerializeToString,
            ),
            "Fetch": grpc.unary_stream_rpc_method_handler(
                self.fetch, request_deserializer=pb.FetchRequest.FromString, response_serializer=identity
            ),
            "Push": grpc.stream_unary_rpc_method_handler(
                self.push, request_deserializer=identity, response_serializer=pb.PushAck.SerializeToString
            ),
            BULK_OPEN: grpc.unary_unary_rpc_method_handler(
                self.relay.bulk.open, request_deserializer=identity, response_serializer=identity
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """A held version's messages from ``from_chunk`` on (`WeightRelay.wire`: as received, or made one
        at a time)."""
        publisher = self.relay.publisher
        held = publisher.get(request.version)
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"version {request.version} is not held (held: {publisher.versions})",
            )
        raws = self.relay.wire(held)
        if request.from_chunk >= len(raws):
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE, f"from_chunk {request.from_chunk} >= {len(raws)} chunks"
            )
        if request.from_chunk > 0:  # a resumed stream's first message carries the manifest too
            first = held.bundle.chunks[request.from_chunk]
            yield WeightsServicer.chunk_message(held, first, first=True).SerializeToString()
        for index in range(request.from_chunk + (request.from_chunk > 0), len(raws)):
            yield raws[index]

    async def push(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> pb.PushAck:
        """Receive a pushed version: admit its manifest, verify and forward each chunk, then hold it.

        Anything refused (a bad manifest or chunk, a version not admitted) ends the push here; the
        children's streams are cancelled so they hold nothing partial, and every node of the subtree is
        reported as not sent.
        """
        relay = self.relay
        relay.pushes_received += 1
        session = Session(relay)
        builder: BundleBuilder | None = None
        received = 0
        route: tuple[Hop, ...] = ()
        version = 0
        try:
            route = route_from_json(metadata_value(context.invocation_metadata(), ROUTE_KEY) or "[]")
            for hop in route:
                session.open(hop)
            incoming = aiter(requests)
            first = await anext(incoming, None)
            if first is None:
                raise WireError("chunks", "the push carried no chunks")
            msg = pb.WeightChunk.FromString(first)
            if not msg.HasField("manifest"):
                raise WireError("chunk[0].manifest", "the first pushed chunk must carry the manifest")
            manifest = m.manifest_from_proto(msg.manifest, "chunk[0].manifest")
            version = manifest.version
            builder = BundleBuilder(manifest)  # its signature first: an unsigned offer costs no call
            await relay.admit(manifest)
            relay.started_receiving(version)

            async def parsed() -> AsyncIterator[tuple[bytes, pb.WeightChunk]]:
                yield first, msg
                async for raw in incoming:
                    yield raw, pb.WeightChunk.FromString(raw)

            async for raw, _ in relay.verifier.verified(builder, parsed()):
                received += 1
                session.send(raw)  # verified: on to the children while the next chunks arrive
            published = await relay.verifier.finish(builder)
            relay.hold(published, session.backlog)
        except (WireError, ValueError) as exc:
            log.warning("refused weights v%d pushed from %s: %s", version, context.peer(), exc)
            if builder is not None:
                builder.close()
            results = session.abort(route, str(exc))
            context.set_trailing_metadata(((RESULT_KEY, json.dumps(results)),))
            return pb.PushAck(ok=False, version=version, chunks_received=received, reason=str(exc))
        except asyncio.CancelledError:  # our sender went away: nothing partial is held or passed on
            session.abort(route, "cancelled")
            raise
        finally:
            if builder is not None:
                relay.done_receiving(builder.manifest.version)
        results = await session.finish()
        context.set_trailing_metadata(((RESULT_KEY, json.dumps(results)),))
        return pb.PushAck(ok=True, version=version, chunks_received=received)
