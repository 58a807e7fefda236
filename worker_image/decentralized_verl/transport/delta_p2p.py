"""Weight deltas over P2P: the coordinator's `Delta` handler and the volunteer's source that asks for a
delta chain first and the full bundle when there is none.

A volunteer holding version b asks for the chain b -> L (L the newest). The reply is a stream: first a
JSON header (the frames' sizes and a digest per piece of their concatenation), then the pieces. Each
piece is checked as it arrives and kept, so a dropped stream resumes from the first missing piece
(`from_piece`); a stream that breaks again having brought nothing new gives up, and the volunteer falls
back to the full bundle (which resumes the same way). The rebuilt bundle is checked against the signed
manifest of L before anything is held: a delta is trusted exactly as much as a full transfer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from google.protobuf import wrappers_pb2

from decentralized_verl.errors import WireError
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.p2p import P2PWeightSource, Unauthorized, peer
from decentralized_verl.transport.weights.codec import WeightChunk
from decentralized_verl.transport.weights.delta import apply_chain
from decentralized_verl.transport.weights.delta_publish import DeltaPublisher, NoDelta
from decentralized_verl.transport.weights.publish import Published
from decentralized_verl.transport.weights.receive import BundleBuilder, decode_held

log = logging.getLogger(__name__)

DELTA = "dverl.Weights/Delta"
PIECE_BYTES = 256 * 1024
"""Small pieces: on a slow, lossy link a dropped stream loses at most one piece's progress."""


def cut(frames: list[bytes], piece_bytes: int = PIECE_BYTES) -> tuple[dict, list[bytes]]:
    """The stream's header and pieces for a chain of frames (pure)."""
    blob = b"".join(frames)
    pieces = [blob[i : i + piece_bytes] for i in range(0, len(blob), piece_bytes)]
    header = {"frames": [len(f) for f in frames], "digests": [digest_hex(p) for p in pieces]}
    return header, pieces


def uncut(header: dict, pieces: dict[int, bytes]) -> list[bytes]:
    """The frames back from verified pieces; WireError when the header is malformed or a piece missing."""
    try:
        sizes = [int(n) for n in header["frames"]]
        count = len(header["digests"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError("weights.delta.header", f"malformed: {exc}") from None
    missing = [i for i in range(count) if i not in pieces]
    if missing:
        raise WireError("weights.delta", f"pieces {missing[:5]} of {count} missing")
    blob = b"".join(pieces[i] for i in range(count))
    if sum(sizes) != len(blob) or any(n <= 0 for n in sizes):
        raise WireError("weights.delta.header", f"frame sizes {sizes} do not add up to {len(blob)} bytes")
    frames, at = [], 0
    for n in sizes:
        frames.append(blob[at : at + n])
        at += n
    return frames


class DeltaEndpoint:
    """The coordinator's `Delta` handler over a `DeltaPublisher`, for admitted peers only."""

    def __init__(
        self,
        p2p,
        publisher: DeltaPublisher,
        is_admitted: Callable[[str], bool],
        *,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self.p2p, self.publisher, self.is_admitted = p2p, publisher, is_admitted
        self.piece_bytes = piece_bytes
        self.served_bytes = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(DELTA, self._delta, wrappers_pb2.StringValue, stream_output=True)

    async def _delta(
        self, request: wrappers_pb2.StringValue, context
    ) -> AsyncIterator[wrappers_pb2.BytesValue]:
        caller = context.remote_id.to_base58()
        if not self.is_admitted(caller):
            raise Unauthorized(f"peer {caller} has not joined this job with a valid token")
        try:
            ask = json.loads(request.value)
            base, version, start = int(ask["base"]), int(ask["version"]), int(ask.get("from_piece", 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"bad delta request: {exc}") from None
        try:
            frames = await asyncio.to_thread(self.publisher.chain, base, version)
        except NoDelta as exc:  # an answer, not an error: the volunteer fetches the full bundle
            yield wrappers_pb2.BytesValue(value=json.dumps({"none": str(exc)}).encode())
            return
        header, pieces = cut(frames, self.piece_bytes)
        if not 0 <= start < len(pieces):
            raise IndexError(f"from_piece {start} outside [0, {len(pieces)})")
        yield wrappers_pb2.BytesValue(value=json.dumps(header).encode())
        for piece in pieces[start:]:
            self.served_bytes += len(piece)
            yield wrappers_pb2.BytesValue(value=piece)


class DeltaP2PWeightSource(P2PWeightSource):
    """`P2PWeightSource` that remembers the bundle it holds and asks for deltas against it.

    Keeps one verified bundle (the wire bytes of the version it serves) besides the model: that is the
    base every delta is applied to. `delta_bytes` / `full_bytes` count what came over the wire each way."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held: Published | None = None
        self.delta_bytes = 0
        self.full_bytes = 0
        self.deltas_used = 0
        self.full_fetches = 0
        self.wait_s_total = 0.0
        self.delta_calls: list[tuple[int, int, int]] = []
        """(base, version, from_piece) of every Delta stream started, for logs and tests."""

    async def fetch_latest_async(self, min_version: int):
        """As `P2PWeightSource`, timed: `wait_s_total` is how long all pulls took (ahead of work or not)."""
        started = time.perf_counter()
        try:
            return await super().fetch_latest_async(min_version)
        finally:
            self.wait_s_total += time.perf_counter() - started

    async def _fetch_async(self, manifest: m.WeightManifest):
        published, used = None, self.deltas_used
        if self.held is not None and self.held.manifest.version < manifest.version:
            try:
                published = await self._via_delta(manifest)
                self.deltas_used += 1
            except (WireError, LookupError) as exc:
                log.info("weights v%d: no delta from v%d (%s); fetching the full bundle",
                         manifest.version, self.held.manifest.version, exc)  # fmt: skip
        if published is None:
            log.info(
                "weights v%d: pulling the full bundle (%d bytes)", manifest.version, manifest.total_bytes
            )
            before = self.bytes_received
            published = await self._fetch_published(manifest)
            self.full_bytes += self.bytes_received - before
            self.full_fetches += 1
        how = "full bundle" if self.deltas_used == used else "delta"
        log.info("weights v%d by %s; so far %d full (%d bytes), %d deltas (%d bytes)", manifest.version, how,
                 self.full_fetches, self.full_bytes, self.deltas_used, self.delta_bytes)  # fmt: skip
        self.held = published
        return decode_held(published)

    async def _via_delta(self, manifest: m.WeightManifest) -> Published:
        assert self.held is not None
        base = self.held.manifest.version
        box: list[dict | None] = [None]  # the stream's header, once one arrived
        pieces: dict[int, bytes] = {}
        failures: list[str] = []
        while box[0] is None or len(pieces) < len(box[0]["digests"]):
            count = None if box[0] is None else len(box[0]["digests"])
            start = 0 if count is None else min(i for i in range(count) if i not in pieces)
            self.delta_calls.append((base, manifest.version, start))
            held_before = len(pieces)
            try:
                await self._stream(base, manifest.version, start, pieces, box)
                if box[0] is not None and len(pieces) == len(box[0]["digests"]):
                    break
                problem = "the stream ended early"
            except LookupError:
                raise
            except Exception as exc:  # a dropped stream: resume while each attempt brings new pieces
                problem = f"{type(exc).__name__}: {exc}"
            failures.append(problem)
            if len(failures) > 1 and len(pieces) == held_before:
                raise WireError("weights.delta", f"from {self.coordinator}: {'; '.join(failures)}")
            log.warning("weights v%d: delta stream broke (%s); resuming", manifest.version, problem)
        header = box[0]
        assert header is not None
        frames = uncut(header, pieces)
        version, payload = await asyncio.to_thread(apply_chain, self.held.bundle.payload(), frames, base)
        if version != manifest.version:
            raise WireError("weights.delta", f"the chain ends at v{version}, not v{manifest.version}")
        builder = BundleBuilder(manifest, self.verify_key)
        size = manifest.chunk_bytes
        for index, at in enumerate(range(0, len(payload), size)):
            part = payload[at : at + size]
            builder.add_hashed(WeightChunk(manifest.version, index, part, digest_hex(part)))
        return builder.finish()

    async def _stream(
        self, base: int, version: int, start: int, pieces: dict[int, bytes], header_box: list
    ) -> None:
        ask = wrappers_pb2.StringValue(
            value=json.dumps({"base": base, "version": version, "from_piece": start})
        )
        stream = await self.p2p.iterate_protobuf_handler(
            peer(self.coordinator), DELTA, ask, wrappers_pb2.BytesValue
        )
        index = start - 1
        async with asyncio.timeout(self.timeout_s):
            async for msg in stream:
                if index == start - 1:
                    header = json.loads(msg.value)
                    if isinstance(header, dict) and "none" in header:
                        raise LookupError(f"no delta: {header['none']}")
                    if not isinstance(header, dict) or not isinstance(header.get("digests"), list):
                        raise WireError("weights.delta.header", "malformed")
                    if header_box[0] is not None and header_box[0] != header:
                        raise WireError("weights.delta.header", "changed between resumed streams")
                    header_box[0] = header
                    index = start
                    continue
                digests = header_box[0]["digests"]
                if index >= len(digests):
                    raise WireError("weights.delta", "more pieces than the header lists")
                if digest_hex(msg.value) != digests[index]:
                    raise WireError(f"weights.delta.piece[{index}]", "digest mismatch (corrupted in transit)")
                pieces[index] = msg.value
                self.delta_bytes += len(msg.value)
                self.bytes_received += len(msg.value)
                index += 1
