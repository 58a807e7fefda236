"""Weight fan-out learner -> N rollout workers without the learner sending N copies: a relay tree.

The learner sends one copy down a chain or tree of relays (rollout workers). A relay verifies chunk k
against the manifest, hands it to its children's Push streams and is already receiving chunk k+1, so a
version reaches every worker in about ``size / bandwidth + depth * chunk latency`` instead of
``N * size / bandwidth``.

The route travels with the data: the sender puts the subtree below each child in the Push call's
metadata (``dverl-fanout-route``), so relays need no configuration beyond their own address. Each
relay answers in its trailing metadata (``dverl-fanout-result``) with the outcome for every node of its
subtree, so the learner learns who holds the version.

Failure rules:
- every chunk is hash-checked (against the manifest) before it is forwarded, and the whole-bundle
  digest is checked before a relay holds the version; a bad chunk ends the push at that relay, and its
  children's streams are cancelled so they hold nothing partial;
- a child that cannot be reached, breaks, or rejects the data is skipped: its parent adopts the child's
  own children (replaying the chunks already sent), so one broken worker never cuts off the others.
  The skipped worker catches up later with `WeightRelay.catch_up` (a Fetch from its parent).

Speed: the runtime pushes over the bulk data plane (`bulk_plane`: BulkOpen carries the signed
manifest over gRPC, the bytes flow over TCP/TLS into one buffer, hashed per chunk and relayed from it);
the gRPC Push below is the fallback. There, messages travel as the serialized bytes they arrived in, each
chunk hashed exactly once (in a worker thread) and never re-encoded.

Routes are planned in `transport.weights.route`. In the runtime (`transport.weights.fanout`) the learner's
`WeightFanout` pushes each version down `plan_route` of its remote rollout workers; each serves a
`WeightRelay` on its own gRPC port and reads weights through `RelayWeightSource`, which falls back to
pulling from the learner. A relay's `WeightPublisher` serves GetManifest/Fetch like the learner's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure
from decentralized_verl.transport.weights.bulk_plane import BULK_OPEN, BulkPlane
from decentralized_verl.transport.weights.codec import WeightChunk
from decentralized_verl.transport.weights.publish import Published, WeightPublisher
from decentralized_verl.transport.weights.push import (
    RESULT_KEY,
    SERVICE,
    Session,
    identity,
    metadata_value,
    wire_messages,
)
from decentralized_verl.transport.weights.receive import BundleBuilder, ChunkFetch
from decentralized_verl.transport.weights.route import ROUTE_KEY, Hop, route_from_json
from decentralized_verl.transport.weights.service import WeightsServicer
from decentralized_verl.transport.weights.version_admission import confirm_with_learner, follows_held

log = logging.getLogger(__name__)

FANOUT_CHUNK_BYTES = 4 * 1024 * 1024
"""Chunk size worth using for fan-out: fewer, larger gRPC messages amortize per-message overhead."""


class WeightRelay:
    """A node of the weight fan-out: the learner (root) or a rollout worker (relay and leaf).

    It holds versions in `publisher` (serving GetManifest/Fetch like `WeightsServicer`), receives Push
    streams and forwards each verified chunk to the children named in the call's route. Use
    `add_to_server` on a grpc.aio server (instead of `WeightsServicer`) or `serve_relay`.
    """

    def __init__(
        self,
        publisher: WeightPublisher | None = None,
        *,
        timeout_s: float = 300.0,
        verify_threads: int = 2,
        grpc_options: Sequence[tuple[str, int]] = (),
        credentials: Any = secure.PROCESS,
        learner: str | None = None,
    ) -> None:
        self.publisher = publisher or WeightPublisher(chunk_bytes=FANOUT_CHUNK_BYTES)
        self.learner = learner
        """The learner's address: a pushed version is taken only while it publishes that version
        (`version_admission`); None (the learner itself, a test relay) takes any newer signed one."""
        self.credentials = credentials
        """What this node's channels and server use (default: this process's job credentials)."""
        self.timeout_s = timeout_s
        self.grpc_options = tuple(grpc_options)
        """Extra gRPC options for this node's channels and server, after the project's defaults."""
        self._servicer = WeightsServicer(self.publisher)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._wire: dict[tuple[int, str], tuple[bytes, ...]] = {}
        if verify_threads < 1:
            raise ValueError(f"verify_threads: must be >= 1 (got {verify_threads})")
        self._verify = ThreadPoolExecutor(verify_threads, thread_name_prefix="relay-verify")
        self._verify_depth = verify_threads
        self.pushes_received = 0
        self.bulk = BulkPlane(self)
        """The bulk data plane (`transport.weights.bulk_plane`): listening once `serve_relay` started it."""
        self.receiving: dict[int, int] = {}
        """version -> pushes of it arriving right now (a reader waits for them rather than pulling)."""

    # ----------------------------------------------------------------- plumbing

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = secure.aio_channel(address, self.credentials, self.grpc_options)
        return self._channels[address]

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self.bulk.close()
        self._verify.shutdown(wait=False, cancel_futures=True)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        handlers = {
            "GetManifest": grpc.unary_unary_rpc_method_handler(
                self._servicer.GetManifest,
                request_deserializer=pb.ManifestRequest.FromString,
                response_serializer=pb.WeightManifest.SerializeToString,
            ),
            "Fetch": grpc.unary_stream_rpc_method_handler(
                self._fetch, request_deserializer=pb.FetchRequest.FromString, response_serializer=identity
            ),
            "Push": grpc.stream_unary_rpc_method_handler(
                self._push, request_deserializer=identity, response_serializer=pb.PushAck.SerializeToString
            ),
            BULK_OPEN: grpc.unary_unary_rpc_method_handler(
                self.bulk.open, request_deserializer=identity, response_serializer=identity
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def admit(self, manifest: m.WeightManifest) -> None:
        """Raise WireError unless a pushed `manifest` follows what this node holds and is what the learner
        publishes now (`version_admission`); run before any chunk is received."""
        held = self.publisher.get(manifest.version)
        follows_held(manifest, self.publisher.latest_version, held.manifest.digest if held else None)
        if self.learner is not None and held is None:
            await confirm_with_learner(manifest, self.channel(self.learner), self.learner)

    def forward(self, hop: Hop, index: int, raw: bytes) -> bytes:
        """The bytes sent to ``hop`` for the index-th message of a push (a hook: tests corrupt here)."""
        return raw

    def wire(self, held: Published) -> tuple[bytes, ...]:
        """The serialized messages of a held version, built once and shared by every stream."""
        key = (held.manifest.version, held.manifest.digest)
        if key not in self._wire:
            self._wire[key] = wire_messages(held)
        self._remember(key, self._wire[key])
        return self._wire[key]

    def _remember(self, key: tuple[int, str], raws: tuple[bytes, ...]) -> None:
        self._wire[key] = raws
        held = set(self.publisher.versions)
        for old in [k for k in self._wire if k[0] not in held]:
            del self._wire[old]

    def publish(self, state_dict, version: int) -> m.WeightManifest:
        """Learner side: encode, hold and pre-serialize a version (so no stream pays for it)."""
        manifest = self.publisher.publish(state_dict, version)
        self.wire(self.publisher.get(version))
        return manifest

    def _store(self, published: Published, raws: Sequence[bytes]) -> None:
        """Hold a verified version; one already held with the same bytes is fine (caught up earlier). With
        no ``raws`` (a bulk transfer) the messages a Fetch serves are built when first asked for."""
        held = self.publisher.get(published.manifest.version)
        if held is not None and held.manifest.digest == published.manifest.digest:
            return
        self.publisher.store(published)
        if raws:
            self._remember((published.manifest.version, published.manifest.digest), tuple(raws))

    # ----------------------------------------------------------------- sending

    async def fan_out(
        self, version: int | None, route: Sequence[Hop], *, timeout_s: float | None = None
    ) -> dict[str, str]:
        """Send a held version (the newest when None) down ``route``; returns address -> "ok" or why not,
        for every node of the route (a skipped node is reported, the nodes below it are still served). A
        child still busy after ``timeout_s`` is cut off with its subtree (they pull instead)."""
        held = self.publisher.get(version)
        if held is None:
            raise WireError(
                "weights.version", f"version {version} is not held (held: {self.publisher.versions})"
            )
        raws = await asyncio.get_running_loop().run_in_executor(self._verify, self.wire, held)
        session = Session(self)
        for hop in route:
            session.open(hop)
        for raw in raws:
            session.send(raw)
        return await session.finish(timeout_s)

    async def fan_out_bulk(
        self, version: int | None, route: Sequence[Hop], *, timeout_s: float | None = None
    ) -> dict[str, str]:
        """`fan_out` over the bulk data plane (`bulk_plane`): the same route, checks and outcomes;
        a node without a bulk plane is reported as ``bulk unavailable: ...``."""
        return await asyncio.to_thread(self.bulk.fan_out, version, route, timeout_s)

    # ----------------------------------------------------------------- serving

    async def _fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        held = self.publisher.get(request.version)
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"version {request.version} is not held (held: {self.publisher.versions})",
            )
        raws = self.wire(held)
        if request.from_chunk >= len(raws):
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE, f"from_chunk {request.from_chunk} >= {len(raws)} chunks"
            )
        if request.from_chunk > 0:  # a resumed stream's first message carries the manifest too
            first = held.bundle.chunks[request.from_chunk]
            yield WeightsServicer.chunk_message(held, first, first=True).SerializeToString()
        for raw in raws[request.from_chunk + (request.from_chunk > 0) :]:
            yield raw

    async def _push(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> pb.PushAck:
        self.pushes_received += 1
        loop = asyncio.get_running_loop()
        session = Session(self)
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
            await self.admit(manifest)
            self.receiving[version] = self.receiving.get(version, 0) + 1

            async def parsed() -> AsyncIterator[tuple[bytes, pb.WeightChunk]]:
                yield first, msg
                async for raw in incoming:
                    yield raw, pb.WeightChunk.FromString(raw)

            async for raw, _ in self._verified(builder, parsed()):
                received += 1
                session.send(raw)  # verified: on to the children while the next chunks arrive
            published = await loop.run_in_executor(self._verify, builder.finish)
            self._store(published, session.backlog)
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
                self._done_receiving(builder.manifest.version)
        results = await session.finish()
        context.set_trailing_metadata(((RESULT_KEY, json.dumps(results)),))
        return pb.PushAck(ok=True, version=version, chunks_received=received)

    async def _verified(
        self, builder: BundleBuilder, messages: AsyncIterator[tuple[bytes, pb.WeightChunk]]
    ) -> AsyncIterator[tuple[bytes, WeightChunk]]:
        """Each message once ``builder`` has verified it, in arrival order.

        Up to ``verify_threads`` chunks are hashed at once (``hashlib`` releases the GIL), so a receiver
        with spare cores verifies faster than one hashing stream; nothing is yielded (forwarded, kept)
        before its own check passed. On an error every chunk still being hashed is waited for, so the
        builder is settled when the caller resumes from ``builder.missing``.
        """
        loop = asyncio.get_running_loop()
        pending: deque[tuple[bytes, asyncio.Future]] = deque()
        try:
            async for raw, msg in messages:
                pending.append((raw, loop.run_in_executor(self._verify, builder.add, msg)))
                while len(pending) >= self._verify_depth or (pending and pending[0][1].done()):
                    raw, done = pending.popleft()
                    yield raw, await done
            while pending:
                raw, done = pending.popleft()
                yield raw, await done
        finally:
            if pending:
                await asyncio.wait([f for _, f in pending])

    def _done_receiving(self, version: int) -> None:
        left = self.receiving.get(version, 0) - 1
        if left > 0:
            self.receiving[version] = left
        else:
            self.receiving.pop(version, None)

    # ----------------------------------------------------------------- catching up

    async def catch_up(
        self, parent: str, min_version: int = 0, *, wait_s: float = 0.0, poll_s: float = 0.1
    ) -> int:
        """Fetch the newest version (>= min_version) from ``parent`` and hold it; returns its version.

        For a node that was skipped by a fan-out, or any receiver in the plain pull mode. Every chunk is
        verified as it arrives; a broken stream is resumed once from the first missing chunk.
        """
        channel = self.channel(parent)
        get_manifest = channel.unary_unary(
            f"/{SERVICE}/GetManifest",
            request_serializer=pb.ManifestRequest.SerializeToString,
            response_deserializer=pb.WeightManifest.FromString,
        )
        fetch_chunks = channel.unary_stream(
            f"/{SERVICE}/Fetch",
            request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=identity,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                manifest = m.manifest_from_proto(
                    await get_manifest(pb.ManifestRequest(latest=True), timeout=self.timeout_s)
                )
                if manifest.version >= min_version:
                    break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise WireError("weights", f"GetManifest from {parent} failed: {exc.details()}") from None
            if loop.time() >= deadline:
                raise WireError(
                    "weights.version", f"{parent} has no version >= {min_version} after {wait_s:g}s"
                )
            await asyncio.sleep(poll_s)
        held = self.publisher.get(manifest.version)
        if held is not None and held.manifest.digest == manifest.digest:
            return manifest.version
        fetch = ChunkFetch(manifest, parent)
        builder = fetch.builder
        raws: dict[int, bytes] = {}
        try:
            while (start := fetch.next_start()) is not None:
                stream = fetch_chunks(
                    pb.FetchRequest(version=manifest.version, from_chunk=start), timeout=self.timeout_s
                )

                async def parsed(stream=stream) -> AsyncIterator[tuple[bytes, pb.WeightChunk]]:
                    async for raw in stream:
                        msg = pb.WeightChunk.FromString(raw)
                        if msg.index not in builder.chunks:  # a resumed stream may repeat a chunk
                            raws[msg.index] = raw  # kept only once the builder holds the index
                            yield raw, msg

                try:
                    async for _ in self._verified(builder, parsed()):
                        pass
                    fetch.stream_ended()
                except grpc.aio.AioRpcError as exc:
                    fetch.failed(f"stream from chunk {start} broke: {exc.code().name}: {exc.details()}")
                except WireError as exc:
                    fetch.failed(str(exc))
            published = await loop.run_in_executor(self._verify, builder.finish)
        finally:
            builder.close()
        ordered = [raws[i] for i in range(len(builder.chunks))]
        if ordered and not pb.WeightChunk.FromString(ordered[0]).HasField("manifest"):
            ordered[0] = WeightsServicer.chunk_message(
                published, published.bundle.chunks[0], first=True
            ).SerializeToString()
        self._store(published, ordered)
        return manifest.version


async def serve_relay(
    relay: WeightRelay,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    add: Iterable[Callable[[grpc.aio.Server], None]] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with ``relay``'s Weights service (and whatever each ``add`` registers, e.g. a
    rollout worker's own services, so the relay shares its port); its port is ``server.port``."""
    server = secure.aio_server(list(relay.grpc_options), relay.credentials)
    relay.add_to_server(server)
    for register in add:
        register(server)
    bound = secure.bind(server, host, port)
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.port = bound  # type: ignore[attr-defined]
    relay.bulk.listen(host)
    await server.start()
    return server
