"""The gRPC `Weights` service over a publisher's versions: GetManifest and Fetch serve what it holds, Push
takes a whole version from a peer (a fan-out relay's parent) and holds it once verified (`receive`).

Its own module so that the publisher (which `receive` stores into) and the receiver (which Push uses)
do not import each other.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights.codec import WeightChunk
from decentralized_verl.transport.weights.publish import Published, WeightPublisher
from decentralized_verl.transport.weights.receive import BundleBuilder, decode_held

log = logging.getLogger(__name__)


class WeightsServicer(pb_grpc.WeightsServicer):
    """Serves a publisher's versions: GetManifest (a version or the latest), Fetch (chunks from an index),
    and Push (a peer hands over a whole version, verified before it is held; for fan-out relays)."""

    def __init__(self, publisher: WeightPublisher) -> None:
        self.publisher = publisher

    async def GetManifest(self, request: pb.ManifestRequest, context: grpc.aio.ServicerContext):
        held = self.publisher.get(None if request.latest else request.version)
        if held is None:
            what = "no version published yet" if request.latest else f"version {request.version} is not held"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{what} (held: {self.publisher.versions})")
        return m.manifest_to_proto(held.manifest)

    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        held = self.publisher.get(request.version)
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"version {request.version} is not held (held: {self.publisher.versions})",
            )
        chunks = held.bundle.chunks
        if request.from_chunk >= len(chunks):
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE, f"from_chunk {request.from_chunk} >= {len(chunks)} chunks"
            )
        for chunk in chunks[request.from_chunk :]:
            yield self.chunk_message(held, chunk, first=chunk.index == request.from_chunk)

    @staticmethod
    def chunk_message(held: Published, chunk: WeightChunk, *, first: bool) -> pb.WeightChunk:
        return m.chunk_to_proto(
            m.WeightChunk(
                version=chunk.version,
                index=chunk.index,
                total=len(held.bundle.chunks),
                data=chunk.data,
                digest=chunk.digest,
                manifest=held.manifest if first else None,
            )
        )

    async def Push(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.PushAck:
        builder: BundleBuilder | None = None
        received = version = 0
        try:
            async for msg in request_iterator:
                if builder is None:
                    if not msg.HasField("manifest"):
                        raise WireError("chunk[0].manifest", "the first pushed chunk must carry the manifest")
                    manifest = m.manifest_from_proto(msg.manifest, "chunk[0].manifest")
                    version = manifest.version
                    builder = BundleBuilder(manifest)
                builder.add(msg)
                received += 1
            if builder is None:
                raise WireError("chunks", "the push carried no chunks")
            published = builder.finish()  # the bundle digest, before anything is held
            decode_held(published)  # a decodable payload, too: this servicer's pullers trust what it holds
            self.publisher.store(published)
        except (WireError, ValueError) as exc:
            log.warning("refused weights v%d pushed from %s: %s", version, context.peer(), exc)
            return pb.PushAck(ok=False, version=version, chunks_received=received, reason=str(exc))
        return pb.PushAck(ok=True, version=published.manifest.version, chunks_received=received)
