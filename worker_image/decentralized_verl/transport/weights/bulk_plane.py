"""The bulk data plane of weight fan-out: gRPC carries the control, a plain TCP (TLS in a secured job)
connection carries the bytes.

Why: a version pushed through gRPC costs each receiver ~0.5 s of CPU per 270 MB outside hashing (HTTP/2
framing, protobuf parsing, copies into Python bytes, re-sending every chunk as a new message), which on a
few shared cores caps four receivers far below the socket (BENCHMARKS.md, "Weight sync"). Here a receiver
reads the payload with large ``recv_into`` calls into one buffer it allocated for the version, hashes each
chunk as soon as its bytes are in, and its children are sent memoryviews of that same buffer.

Per hop (sender -> receiver):
1. gRPC ``BulkOpen`` (on the receiver's Weights service, so TLS and the job token are checked as for every
   call): the request is the signed manifest, the call's metadata the receiver's subtree (as for Push).
   The receiver checks the manifest (its bundle digest over the chunk digests, and the learner's signature
   in a secured job) before anything else, and answers with its bulk port and a single-use ticket.
2. The sender connects to that port (TLS with the job's CA in a secured job), presents the ticket and
   writes the payload (`transport.weights.bulk_wire`). Only chunks the sender has itself verified are sent.
3. The receiver checks every chunk against the manifest's digest as it arrives and forwards the verified
   prefix to its children; once all are in, the bundle digest is checked (`BundleBuilder`), the version is
   held, and, after its children answered, it replies with the outcome for its subtree.

Failure rules are the gRPC Push's (`transport.weights.relay`): a bad or missing byte ends the transfer at that
receiver (the error names the peer it came from), its children's connections are closed so they hold
nothing partial; a child that cannot be reached or fails is skipped and its children adopted (sent from
byte 0 of the same buffer). A child without a bulk listener (an older build, a port a firewall closes) is
reported as ``bulk unavailable``, which `WeightFanout` answers with a gRPC Push to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import socket
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.weights import bulk_wire as bw
from decentralized_verl.transport.weights.bulk_send import NO_LISTENER, BulkSession
from decentralized_verl.transport.weights.codec import WeightChunk
from decentralized_verl.transport.weights.push import SERVICE, identity, metadata_value
from decentralized_verl.transport.weights.receive import BundleBuilder
from decentralized_verl.transport.weights.route import ROUTE_KEY, Hop, route_from_json, route_to_json

if TYPE_CHECKING:
    from decentralized_verl.transport.weights.node import RelayNode

log = logging.getLogger(__name__)

BULK_OPEN = "BulkOpen"
MAX_CONNECTIONS = 32
"""Bulk connections served at once, whoever opens them; more are closed as they are accepted."""
HEADER_DEADLINE_S = 5.0
"""A connection must complete TLS and present its ticket within this, or it is dropped."""


@dataclass
class Incoming:
    """A transfer `BulkOpen` admitted, waiting for its data connection."""

    builder: BundleBuilder
    route: tuple[Hop, ...]
    loop: asyncio.AbstractEventLoop


class BulkPlane:
    """A fan-out node's bulk plane: its listener (for versions pushed to it) and its senders."""

    def __init__(self, relay: RelayNode) -> None:
        self.relay = relay
        self.port = 0
        self.refused: list[str] = []
        """Why incoming transfers were refused, oldest first (for logs and tests)."""
        self.buffers = bw.BufferPool()
        """Receive buffers, reused once the version they held is gone."""
        self._listener: socket.socket | None = None
        self._pending: dict[bytes, Incoming] = {}
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False
        self._serving = 0
        """Connections with a thread of their own right now (at most `MAX_CONNECTIONS`)."""

    @functools.cached_property
    def _credentials(self) -> Any:
        return secure.resolve(self.relay.credentials)

    @functools.cached_property
    def client_tls(self) -> Any:
        return None if self._credentials is None else bw.client_context(self._credentials)

    # ----------------------------------------------------------------- listening

    def listen(self, host: str) -> int:
        """Accept bulk connections on ``host`` (a port of the system's choosing); returns the port."""
        tls = None if self._credentials is None else bw.server_context(self._credentials)
        bare = host.strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        self._listener = socket.create_server((bare, 0), family=family, backlog=64)
        self._listener.settimeout(0.5)  # so `close` is noticed
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(tls,), daemon=True, name="bulk-accept").start()
        return self.port

    def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _accept(self, tls: Any) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()  # type: ignore[union-attr]
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._admit_connection():
                # Nobody is expected (no ticket is open) or too many are in already: a connection
                # that no `BulkOpen` announced costs an accept and a close, never a thread.
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, tls), daemon=True, name="bulk-recv").start()

    def _admit_connection(self) -> bool:
        with self._lock:
            if not self._pending or self._serving >= min(MAX_CONNECTIONS, 2 * len(self._pending) + 2):
                return False
            self._serving += 1
            return True

    async def open(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """``BulkOpen``: admit one version (signed manifest checked first) and hand out a ticket."""
        try:
            manifest = m.manifest_from_proto(pb.WeightManifest.FromString(request), "manifest")
            route = route_from_json(metadata_value(context.invocation_metadata(), ROUTE_KEY) or "[]")
            builder = BundleBuilder(manifest)  # bundle digest and signature, before any byte
            await self.relay.admit(manifest)  # newer than held, and the learner's current version
        except Exception as exc:  # a garbled, forged or unsigned manifest: refused, nothing allocated
            reason = str(exc) if isinstance(exc, WireError) else f"manifest: not parseable ({exc})"
            log.warning("refused a bulk transfer offered by %s: %s", context.peer(), reason)
            self.refused.append(reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        if self._listener is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, NO_LISTENER)
        ticket = secrets.token_bytes(bw.TICKET_BYTES)
        loop = asyncio.get_running_loop()
        with self._lock:
            self._pending[ticket] = Incoming(builder, route, loop)
        version = manifest.version
        self.relay.started_receiving(version)
        loop.call_later(self.relay.timeout_s, self._expire, ticket)
        return json.dumps({"port": self.port, "ticket": ticket.hex()}).encode()

    def _expire(self, ticket: bytes) -> None:
        with self._lock:
            incoming = self._pending.pop(ticket, None)
        if incoming is not None:  # the data never came
            self.relay.done_receiving(incoming.builder.manifest.version)

    # ----------------------------------------------------------------- receiving

    def _serve(self, conn: socket.socket, tls: Any) -> None:
        peer = bw.peer_name(conn)
        incoming: Incoming | None = None
        try:
            conn.settimeout(min(HEADER_DEADLINE_S, self.relay.timeout_s))  # the handshake and the ticket
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                conn = tls.wrap_socket(conn, server_side=True)
            head = bw.recv_exact(conn, bw.HEADER_BYTES, "bulk.header", peer)
            conn.settimeout(self.relay.timeout_s)
            if head[: len(bw.MAGIC)] != bw.MAGIC:
                raise WireError("bulk.header", f"{peer} did not open with the bulk header")
            with self._lock:
                incoming = self._pending.pop(head[len(bw.MAGIC) :], None)
            if incoming is None:
                raise WireError("bulk.ticket", f"{peer} presented no open ticket (unknown, used or expired)")
            ok, reason, results = self._receive(conn, incoming, peer)
            bw.send_reply(conn, ok, reason, results)
        except (WireError, OSError) as exc:
            log.warning("bulk connection from %s dropped: %s", peer, exc)
            self.refused.append(str(exc))
        finally:
            conn.close()
            with self._lock:
                self._serving -= 1
            if incoming is not None:
                version = incoming.builder.manifest.version
                with contextlib.suppress(RuntimeError):  # the relay's loop is gone: nobody is waiting
                    incoming.loop.call_soon_threadsafe(self.relay.done_receiving, version)

    def _receive(
        self, conn: socket.socket, incoming: Incoming, peer: str
    ) -> tuple[bool, str, dict[str, str]]:
        """Fill a fresh buffer from ``conn``, verifying and forwarding as it fills; hold the version."""
        builder = incoming.builder
        manifest = builder.manifest
        buffer = self.buffers.take(manifest.total_bytes)
        session = BulkSession(self, manifest, bw.Payload.of([buffer]), ready=0)
        for hop in incoming.route:
            session.open(hop)
        got = [0]  # bytes read so far, kept when the fill stops early
        try:
            self._fill(conn, buffer, builder, session, peer, got)
            published = builder.finish()  # the chunk digests against the (signed) bundle digest
            self.relay.hold(published, ())
        except (WireError, ValueError, OSError) as exc:
            reason = str(exc)
            log.warning("refused weights v%d sent in bulk from %s: %s", manifest.version, peer, reason)
            self.refused.append(reason)
            results = session.abort(incoming.route, reason)
            if isinstance(exc, WireError):
                _drain(conn, manifest.total_bytes - got[0])  # so the sender reaches our verdict
            return False, reason, results
        return True, "", session.finish()

    def _fill(
        self,
        conn: socket.socket,
        buffer: memoryview,
        builder: BundleBuilder,
        session: BulkSession,
        peer: str,
        progress: list[int],
    ) -> None:
        manifest = builder.manifest
        total, size = manifest.total_bytes, manifest.chunk_bytes
        count = len(manifest.chunk_digests)
        readonly = buffer.toreadonly()

        def end(k: int) -> int:
            return min(total, (k + 1) * size)

        def check(k: int) -> None:
            data = readonly[k * size : end(k)]
            digest = digest_hex(data)
            if digest != manifest.chunk_digests[k]:
                raise WireError(
                    f"weights[v{manifest.version}].chunk[{k}]",
                    f"digest mismatch in the bytes from {peer} (corrupted in transit or by the sender)",
                )
            builder.add_hashed(WeightChunk(manifest.version, k, data, digest))

        pending: deque[tuple[int, Future]] = deque()
        got = hashed = 0
        try:
            while got < total:
                n = conn.recv_into(buffer[got:], min(bw.RECV_BYTES, total - got))
                if n == 0:
                    raise WireError(
                        f"weights[v{manifest.version}].bulk",
                        f"{peer} ended the stream after {got} of {total} bytes",
                    )
                got += n
                progress[0] = got
                while hashed < count and end(hashed) <= got:
                    pending.append((hashed, self.relay.verifier.submit(check, hashed)))
                    hashed += 1
                while pending and pending[0][1].done():
                    k, done = pending.popleft()
                    done.result()
                    session.advance(end(k))
            while pending:
                k, done = pending.popleft()
                done.result()
                session.advance(end(k))
        finally:
            for _, future in pending:
                future.cancel()
            for _, future in pending:
                if not future.cancelled():
                    future.exception()  # settled before the buffer is given up

    # ----------------------------------------------------------------- sending

    def offer(self, hop: Hop, manifest_bytes: bytes) -> tuple[int, bytes]:
        """``BulkOpen`` on ``hop``: its bulk port and ticket (grpc.RpcError when it refuses)."""
        if hop.address not in self._channels:
            self._channels[hop.address] = secure.sync_channel(hop.address, self.relay.credentials)
        call = self._channels[hop.address].unary_unary(
            f"/{SERVICE}/{BULK_OPEN}", request_serializer=identity, response_deserializer=identity
        )
        raw = call(
            manifest_bytes,
            metadata=((ROUTE_KEY, route_to_json(hop.children)),),
            timeout=min(self.relay.timeout_s, 60.0),
        )
        reply = json.loads(raw)
        return int(reply["port"]), bytes.fromhex(reply["ticket"])

    def fan_out(self, version: int | None, route: Iterable[Hop], timeout_s: float | None) -> dict[str, str]:
        """Blocking: send a held version down ``route`` over the bulk plane; address -> "ok" or why not."""
        held = self.relay.publisher.get(version)
        if held is None:
            raise WireError(
                "weights.version", f"version {version} is not held (held: {self.relay.publisher.versions})"
            )
        payload = bw.Payload.of([c.data for c in held.bundle.chunks])
        session = BulkSession(self, held.manifest, payload, ready=payload.total)
        for hop in route:
            session.open(hop)
        return session.finish(timeout_s)


def _drain(conn: socket.socket, left: int) -> None:
    """Read and drop what the sender still writes, so it reaches the point of reading our verdict."""
    scratch = memoryview(bytearray(min(max(left, 1), bw.RECV_BYTES)))
    try:
        while left > 0:
            n = conn.recv_into(scratch, min(left, len(scratch)))
            if n == 0:
                return
            left -= n
    except OSError:
        return
