"""A relay catching up: pulling a version from its parent's GetManifest/Fetch instead of being pushed it.

A worker the fan-out skipped (it was down, slow or rejected the data) and a receiver in the plain pull
mode both end up here. The pull is kept apart from the push side because it follows a different policy:
wait for a new enough version to appear, then resume a broken stream from the first missing chunk
(`ChunkFetch`), where a push is one stream that succeeds or is refused whole.
"""

from __future__ import annotations

import asyncio

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights.chunk_verify import ChunkVerifier
from decentralized_verl.transport.weights.publish import Published
from decentralized_verl.transport.weights.push import SERVICE, identity
from decentralized_verl.transport.weights.receive import ChunkFetch
from decentralized_verl.transport.weights.service import WeightsServicer


async def newest_manifest(
    channel: grpc.aio.Channel,
    parent: str,
    min_version: int,
    *,
    timeout_s: float,
    wait_s: float,
    poll_s: float,
) -> m.WeightManifest:
    """The newest manifest ``parent`` publishes, asked every ``poll_s`` until it is >= ``min_version``.

    A parent holding nothing yet (NOT_FOUND) is asked again; after ``wait_s`` without a new enough
    version, or on any other failure, WireError names the parent.
    """
    get_manifest = channel.unary_unary(
        f"/{SERVICE}/GetManifest",
        request_serializer=pb.ManifestRequest.SerializeToString,
        response_deserializer=pb.WeightManifest.FromString,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            manifest = m.manifest_from_proto(
                await get_manifest(pb.ManifestRequest(latest=True), timeout=timeout_s)
            )
            if manifest.version >= min_version:
                return manifest
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise WireError("weights", f"GetManifest from {parent} failed: {exc.details()}") from None
        if loop.time() >= deadline:
            raise WireError("weights.version", f"{parent} has no version >= {min_version} after {wait_s:g}s")
        await asyncio.sleep(poll_s)


async def fetch_version(
    channel: grpc.aio.Channel,
    parent: str,
    manifest: m.WeightManifest,
    *,
    timeout_s: float,
    verifier: ChunkVerifier,
) -> tuple[Published, list[bytes]]:
    """Every chunk of ``manifest``'s version from ``parent``, each verified as it arrives; a broken
    stream is resumed from the first missing chunk (`ChunkFetch`).

    Returns the verified version with its messages in chunk order, the first carrying the manifest, so
    the relay can serve Fetch from them without serializing again.
    """
    fetch_chunks = channel.unary_stream(
        f"/{SERVICE}/Fetch",
        request_serializer=pb.FetchRequest.SerializeToString,
        response_deserializer=identity,
    )
    fetch = ChunkFetch(manifest, parent)
    builder = fetch.builder
    raws: dict[int, bytes] = {}
    try:
        while (start := fetch.next_start()) is not None:
            stream = fetch_chunks(
                pb.FetchRequest(version=manifest.version, from_chunk=start), timeout=timeout_s
            )

            async def parsed(stream=stream):
                async for raw in stream:
                    msg = pb.WeightChunk.FromString(raw)
                    if msg.index not in builder.chunks:  # a resumed stream may repeat a chunk
                        raws[msg.index] = raw  # kept only once the builder holds the index
                        yield raw, msg

            try:
                async for _ in verifier.verified(builder, parsed()):
                    pass
                fetch.stream_ended()
            except grpc.aio.AioRpcError as exc:
                fetch.failed(f"stream from chunk {start} broke: {exc.code().name}: {exc.details()}")
            except WireError as exc:
                fetch.failed(str(exc))
        published = await verifier.finish(builder)
    finally:
        builder.close()
    ordered = [raws[i] for i in range(len(builder.chunks))]
    if ordered and not pb.WeightChunk.FromString(ordered[0]).HasField("manifest"):
        ordered[0] = WeightsServicer.chunk_message(
            published, published.bundle.chunks[0], first=True
        ).SerializeToString()
    return published, ordered
