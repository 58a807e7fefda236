"""Work, results and weights over Hivemind's P2P streams, carrying the gRPC services' protobuf messages.

A volunteer cannot accept inbound gRPC, but it can register libp2p stream handlers that the
coordinator opens streams to (directly, or through a relay). The coordinator in turn serves join,
the job's spec and the weights. Messages are the same `dverl.proto` types as in-cluster gRPC and are
validated by the same `transport.messages` converters on receipt.

Every handler authorizes its caller by the libp2p peer id (authenticated by the secure channel):
a volunteer serves generation only to the coordinator named in its token; the coordinator serves
weights and the spec only to peers whose join token it verified.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from google.protobuf import wrappers_pb2

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.security.trust import PROCESS_KEY
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights.receive import ChunkFetch, decode_held
from decentralized_verl.transport.weights.service import WeightsServicer

log = logging.getLogger(__name__)

JOIN = "dverl.Volunteer/Join"
SPEC = "dverl.Volunteer/Spec"
MANIFEST = "dverl.Weights/GetManifest"
FETCH = "dverl.Weights/Fetch"
GENERATE = "dverl.Rollout/Generate"


class Unauthorized(PermissionError):
    pass


def peer(peer_id: str):
    from hivemind.p2p import PeerID  # noqa: PLC0415 optional: hivemind (the volunteer extra); every gRPC client imports this module

    return PeerID.from_base58(peer_id)


def listen_maddrs(dht) -> tuple[str, ...]:
    """This peer's visible addresses without the /p2p/ID suffix (what goes into its DHT record)."""
    return tuple(str(a).split("/p2p/")[0] for a in dht.get_visible_maddrs())


async def connect(p2p, peer_id: str, maddrs: Sequence[str], *, timeout: float = 10.0) -> bool:
    """Dial `peer_id` at its announced addresses; False (logged) when none answers."""
    from hivemind.utils.multiaddr import Multiaddr  # noqa: PLC0415 optional: hivemind (the volunteer extra); every gRPC client imports this module

    if not maddrs:
        return False
    try:
        await asyncio.wait_for(p2p._client.connect(peer(peer_id), [Multiaddr(a) for a in maddrs]), timeout)
        return True
    except Exception as exc:  # unreachable addresses: libp2p routing or a relay may still find it
        log.debug("could not dial %s at %s: %s", peer_id, maddrs, exc)
        return False


# ------------------------------------------------------------------------------ coordinator side
class CoordinatorEndpoints:
    """The coordinator's P2P handlers: Join (anyone), Spec / GetManifest / Fetch (admitted peers only).

    `admit(request, peer_id) -> JoinReply` decides a join (discovery.py verifies the token there);
    `is_admitted(peer_id)` gates the rest; `publisher` is the learner's WeightPublisher.
    """

    def __init__(
        self,
        p2p,
        *,
        admit: Callable[[m.JoinRequest, str], m.JoinReply],
        is_admitted: Callable[[str], bool],
        publisher,
        spec_json: str,
    ) -> None:
        self.p2p = p2p
        self.admit = admit
        self.is_admitted = is_admitted
        self.publisher = publisher
        self.spec_json = spec_json

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(JOIN, self._join, pb.JoinRequest)
        await self.p2p.add_protobuf_handler(SPEC, self._spec, wrappers_pb2.StringValue)
        await self.p2p.add_protobuf_handler(MANIFEST, self._manifest, pb.ManifestRequest)
        await self.p2p.add_protobuf_handler(FETCH, self._fetch, pb.FetchRequest, stream_output=True)

    def _authorize(self, context) -> str:
        caller = context.remote_id.to_base58()
        if not self.is_admitted(caller):
            raise Unauthorized(f"peer {caller} has not joined this job with a valid token")
        return caller

    async def _join(self, request: pb.JoinRequest, context) -> pb.JoinReply:
        caller = context.remote_id.to_base58()
        try:
            join = m.join_request_from_proto(request)
        except WireError as exc:
            return m.join_reply_to_proto(m.JoinReply(False, reason=f"bad join request: {exc}"))
        return m.join_reply_to_proto(self.admit(join, caller))

    async def _spec(self, request: wrappers_pb2.StringValue, context) -> wrappers_pb2.StringValue:
        self._authorize(context)
        return wrappers_pb2.StringValue(value=self.spec_json)

    async def _manifest(self, request: pb.ManifestRequest, context) -> pb.WeightManifest:
        self._authorize(context)
        held = self.publisher.get(None if request.latest else request.version)
        if held is None:
            raise LookupError(f"version not held (held: {self.publisher.versions})")
        return m.manifest_to_proto(held.manifest)

    async def _fetch(self, request: pb.FetchRequest, context) -> AsyncIterator[pb.WeightChunk]:
        self._authorize(context)
        held = self.publisher.get(request.version)
        if held is None:
            raise LookupError(f"version {request.version} is not held (held: {self.publisher.versions})")
        chunks = held.bundle.chunks
        if request.from_chunk >= len(chunks):
            raise IndexError(f"from_chunk {request.from_chunk} >= {len(chunks)} chunks")
        for chunk in chunks[request.from_chunk :]:
            yield WeightsServicer.chunk_message(held, chunk, first=chunk.index == request.from_chunk)


# ------------------------------------------------------------------------------- volunteer side
async def join(p2p, coordinator: str, request: m.JoinRequest, *, timeout: float = 30.0) -> m.JoinReply:
    reply = await asyncio.wait_for(
        p2p.call_protobuf_handler(peer(coordinator), JOIN, m.join_request_to_proto(request), pb.JoinReply),
        timeout,
    )
    return m.join_reply_from_proto(reply)


async def fetch_spec(p2p, coordinator: str, job: str, *, timeout: float = 30.0) -> str:
    reply = await asyncio.wait_for(
        p2p.call_protobuf_handler(
            peer(coordinator), SPEC, wrappers_pb2.StringValue(value=job), wrappers_pb2.StringValue
        ),
        timeout,
    )
    return reply.value


class P2PWeightSource:
    """`WeightSource` over P2P: the newest version from the coordinator, every chunk hash-checked.

    Blocking like `GrpcWeightSource` (rollout workers call it from their generation thread); the
    calls run on the event loop that owns `p2p`. A broken or corrupted stream is resumed once from
    the first missing chunk; a second failure raises WireError and the weights stay as they were.
    """

    def __init__(
        self,
        p2p,
        coordinator: str,
        loop: asyncio.AbstractEventLoop,
        *,
        wait_s: float = 120.0,
        timeout_s: float = 300.0,
        poll_s: float = 0.25,
        verify_key: bytes | object | None = PROCESS_KEY,
    ) -> None:
        self.p2p, self.coordinator, self.loop = p2p, coordinator, loop
        self.verify_key = verify_key
        """The job's weight key (a volunteer's, from its JoinReply): every version must be signed with it."""
        self.wait_s, self.timeout_s, self.poll_s = wait_s, timeout_s, poll_s
        self.fetch_calls: list[tuple[int, int]] = []
        self.bytes_received = 0

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s + 5)

    async def latest_manifest(self) -> m.WeightManifest | None:
        try:
            msg = await asyncio.wait_for(
                self.p2p.call_protobuf_handler(
                    peer(self.coordinator), MANIFEST, pb.ManifestRequest(latest=True), pb.WeightManifest
                ),
                self.timeout_s,
            )
        except Exception as exc:  # hivemind's P2PHandlerError carries the remote reason
            if "not held" in str(exc):
                return None
            raise WireError("weights", f"GetManifest from {self.coordinator} failed: {exc}") from None
        return m.manifest_from_proto(msg)

    async def _fetch_async(self, manifest: m.WeightManifest):
        return decode_held(await self._fetch_published(manifest))

    async def _fetch_published(self, manifest: m.WeightManifest):
        """Every chunk of `manifest`'s version, verified (not decoded)."""
        fetch = ChunkFetch(manifest, self.coordinator, self.verify_key)
        while (start := fetch.next_start()) is not None:
            self.fetch_calls.append((manifest.version, start))
            try:
                stream = await self.p2p.iterate_protobuf_handler(
                    peer(self.coordinator),
                    FETCH,
                    pb.FetchRequest(version=manifest.version, from_chunk=start),
                    pb.WeightChunk,
                )
                async with asyncio.timeout(self.timeout_s):
                    async for msg in stream:
                        if msg.index in fetch.builder.chunks:
                            continue
                        chunk = fetch.builder.add(msg, f"weights[v{manifest.version}].chunk")
                        self.bytes_received += len(chunk.data)
                fetch.stream_ended()
            except WireError as exc:
                fetch.failed(str(exc))
            except Exception as exc:
                fetch.failed(f"stream from chunk {start} broke: {type(exc).__name__}: {exc}")
        return fetch.builder.finish()

    async def fetch_latest_async(self, min_version: int):
        deadline = self.loop.time() + self.wait_s
        while True:
            manifest = await self.latest_manifest()
            if manifest is not None and manifest.version >= min_version:
                break
            if self.loop.time() >= deadline:
                held = "none" if manifest is None else str(manifest.version)
                raise WireError(
                    "weights.version",
                    f"coordinator has no version >= {min_version} after {self.wait_s:g}s (latest: {held})",
                )
            await asyncio.sleep(self.poll_s)
        return manifest.version, await self._fetch_async(manifest)

    def fetch_latest(self, min_version: int):
        return self._run(self.fetch_latest_async(min_version))
