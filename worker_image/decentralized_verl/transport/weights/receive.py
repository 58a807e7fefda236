"""Receiving weights: each wire chunk checked against its manifest as it arrives, one version assembled
and verified before anything is held, and the pullers rollout workers read their weights through.

Every receiver goes through `BundleBuilder` (the codec's `WeightAssembler` behind the wire manifest's
checks) and follows `ChunkFetch`'s policy: stream from the first missing chunk, resume once, then fail
loudly with the weights as they were.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
from torch import Tensor

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.security.trust import PROCESS_KEY, weights_verify_key
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure
from decentralized_verl.transport.rpc_errors import rpc_reason
from decentralized_verl.transport.weights import signing
from decentralized_verl.transport.weights.codec import (
    WeightAssembler,
    WeightChunk,
    bundle_digest,
    decode_bundle,
)
from decentralized_verl.transport.weights.publish import Published, WeightPublisher, header_of

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ receiving


def checked_chunk(msg: pb.WeightChunk, manifest: m.WeightManifest, path: str) -> WeightChunk:
    """`messages.chunk_from_proto` (place, size, its own and the manifest's digest; the bytes hashed
    once), plus: a manifest riding on the chunk must be the one this transfer started with."""
    chunk = m.chunk_from_proto(msg, manifest, path)
    if chunk.manifest is not None and chunk.manifest != manifest:
        raise WireError(f"{path}.manifest", "differs from the manifest this transfer started with")
    return WeightChunk(chunk.version, chunk.index, chunk.data, chunk.digest)


class BundleBuilder:
    """One version's chunks as they arrive from the wire, in any order, each hashed once and checked
    against the manifest, then kept by the codec's `WeightAssembler`; `finish` checks the bundle digest
    and returns the verified version (not decoded).

    The manifest's own consistency (its bundle digest over its chunk digests) and its signature (when
    this process trusts a weight key: every worker of a secured job, a volunteer once admitted) are
    checked up front, so a forged, garbled or unsigned manifest is refused before any chunk is received.
    """

    def __init__(self, manifest: m.WeightManifest, verify_key: bytes | object | None = PROCESS_KEY) -> None:
        if bundle_digest(manifest.chunk_digests) != manifest.digest:
            raise WireError("manifest.digest", "does not match the bundle digest of its chunk_digests list")
        key = weights_verify_key() if verify_key is PROCESS_KEY else verify_key
        if key is not None:
            signing.check(manifest, key)  # type: ignore[arg-type]
        self.manifest = manifest
        self.assembler = WeightAssembler(header_of(manifest))
        self._lock = threading.Lock()  # `add` may run in several hashing threads at once

    @property
    def chunks(self) -> dict[int, WeightChunk]:
        """Index -> accepted chunk."""
        return self.assembler.received

    @property
    def complete(self) -> bool:
        return self.assembler.complete

    @property
    def missing(self) -> list[int]:
        return self.assembler.missing

    def add(self, msg: pb.WeightChunk, path: str = "chunk") -> WeightChunk:
        """Check one parsed message and keep it; a rejected chunk leaves the builder as it was.
        Thread-safe: chunks may be hashed in parallel."""
        chunk = checked_chunk(msg, self.manifest, f"{path}[{msg.index}]")
        with self._lock:
            if chunk.index in self.chunks:
                raise WireError(f"{path}[{chunk.index}]", "received twice")
            self.assembler.add(chunk, hashed=True)
        return chunk

    def add_hashed(self, chunk: WeightChunk) -> None:
        """Keep a chunk whose digest the caller computed from its bytes (the bulk plane hashes a buffer
        in place); it must be the manifest's digest for its index. Thread-safe like `add`."""
        where = f"weights[v{self.manifest.version}].chunk[{chunk.index}]"
        if not 0 <= chunk.index < len(self.manifest.chunk_digests):
            raise WireError(where, f"index outside [0, {len(self.manifest.chunk_digests)})")
        if chunk.digest != self.manifest.chunk_digests[chunk.index]:
            raise WireError(where, "digest differs from the manifest's")
        with self._lock:
            self.assembler.add(chunk, hashed=True)

    def finish(self) -> Published:
        """The verified version, once every chunk is in and the digests match the manifest's."""
        return Published(self.manifest, self.assembler.bundle())

    def close(self) -> None:
        """Nothing to release (kept so callers may treat builders as resources)."""


class ChunkFetch:
    """The policy of pulling one version from a source: stream from the first missing chunk; when a
    stream breaks or brings a bad chunk, resume from the next missing chunk (every verified chunk is
    kept). The first break is forgiven; after it, a stream that breaks having brought no new chunk raises
    `WireError` and nothing is held, while one that made progress is resumed again, so a flaky link that
    drops a long transfer several times still finishes it. Every puller (gRPC, P2P, a relay catching up)
    follows it."""

    def __init__(
        self, manifest: m.WeightManifest, source: str, verify_key: bytes | object | None = PROCESS_KEY
    ) -> None:
        self.builder = BundleBuilder(manifest, verify_key)
        self.source = source
        self.failures: list[str] = []
        self._held_at_failure = 0

    def next_start(self) -> int | None:
        """The chunk the next stream starts at; None once every chunk is in."""
        return None if self.builder.complete else self.builder.missing[0]

    def stream_ended(self) -> None:
        if not self.builder.complete:
            raise WireError("weights.chunks", f"stream ended with chunks {self.builder.missing} missing")

    def failed(self, reason: str) -> None:
        """Record a broken stream; raises on a second one that brought nothing new."""
        self.failures.append(reason)
        version = self.builder.manifest.version
        held = len(self.builder.chunks)
        progressed, self._held_at_failure = held > self._held_at_failure, held
        if len(self.failures) > 1 and not progressed:
            raise WireError(
                f"weights[v{version}]",
                f"fetch from {self.source} failed {_times(len(self.failures))}: {'; '.join(self.failures)}",
            )
        log.warning("weights v%d: %s; resuming from chunk %d", version, reason, self.builder.missing[0])


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


# ------------------------------------------------------------------------------------------ pullers


def decode_held(held: Published) -> dict[str, Tensor]:
    """The tensors of a held version (wire dtype). A publisher only holds versions it encoded or that
    passed a `BundleBuilder`, so the bytes are not hashed again here."""
    try:
        return decode_bundle(held.bundle)
    except WireError:
        raise
    except Exception as exc:  # a payload that verified but does not decode (a sender bug)
        raise WireError(f"weights[v{held.manifest.version}].payload", f"cannot be decoded ({exc})") from None


class LocalWeightSource:
    """In-process puller (colocated rollout): same codec and checks, no sockets."""

    def __init__(self, publisher: WeightPublisher, *, wait_s: float = 60.0) -> None:
        self.publisher = publisher
        self.wait_s = wait_s

    def fetch_latest(self, min_version: int) -> tuple[int, dict[str, Tensor]]:
        held = self.publisher.wait_for(min_version, self.wait_s)
        if held is None:
            raise WireError(
                "weights.version",
                f"no version >= {min_version} published within {self.wait_s:g}s "
                f"(held: {self.publisher.versions})",
            )
        return held.manifest.version, decode_held(held)


class GrpcWeightSource:
    """Rollout side: pulls the newest version from a `Weights` service, verifying every byte.

    Blocking (rollout workers call it from their generation thread). Waits up to `wait_s` for a version
    >= the requested one to be published; a broken or corrupted stream is retried once, resuming from
    the first missing chunk; a second failure raises `WireError` and the caller's weights stay as they were.
    """

    def __init__(
        self, address: str, *, wait_s: float = 60.0, timeout_s: float = 300.0, poll_s: float = 0.2
    ) -> None:
        self.address = address
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._channel = secure.sync_channel(address)
        self._stub = pb_grpc.WeightsStub(self._channel)
        self.fetch_calls: list[tuple[int, int]] = []
        """(version, from_chunk) of every Fetch started, for logs and tests."""

    def close(self) -> None:
        self._channel.close()

    def latest_manifest(self) -> m.WeightManifest | None:
        try:
            msg = self._stub.GetManifest(pb.ManifestRequest(latest=True), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise WireError("weights", f"GetManifest from {self.address} failed: {rpc_reason(exc)}") from None
        return m.manifest_from_proto(msg)

    def fetch_latest(self, min_version: int) -> tuple[int, dict[str, Tensor]]:
        deadline = time.monotonic() + self.wait_s
        while True:
            manifest = self.latest_manifest()
            if manifest is not None and manifest.version >= min_version:
                break
            if time.monotonic() >= deadline:
                held = "none" if manifest is None else str(manifest.version)
                raise WireError(
                    "weights.version",
                    f"{self.address} has no version >= {min_version} after {self.wait_s:g}s (latest: {held})",
                )
            time.sleep(self.poll_s)
        return manifest.version, self.fetch(manifest)

    def fetch(self, manifest: m.WeightManifest) -> dict[str, Tensor]:
        """Every chunk of `manifest`'s version, verified, then decoded (tensors in the wire dtype)."""
        fetch = ChunkFetch(manifest, self.address)
        while (start := fetch.next_start()) is not None:
            self.fetch_calls.append((manifest.version, start))
            try:
                stream = self._stub.Fetch(
                    pb.FetchRequest(version=manifest.version, from_chunk=start), timeout=self.timeout_s
                )
                for msg in stream:
                    if msg.index not in fetch.builder.chunks:
                        fetch.builder.add(msg, f"weights[v{manifest.version}].chunk")
                fetch.stream_ended()
            except grpc.RpcError as exc:
                fetch.failed(f"stream from chunk {start} broke: {rpc_reason(exc)}")
            except WireError as exc:
                fetch.failed(str(exc))
        return decode_held(fetch.builder.finish())
