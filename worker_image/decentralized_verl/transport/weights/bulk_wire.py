"""The socket layer of the bulk weight plane: TLS with the job's certificates, the connection's opening and
closing frames, and the payload as byte ranges sent straight from memory.

A bulk connection carries exactly one version's payload, the bytes the gRPC `BulkOpen` call announced
(its signed manifest names every chunk digest). Its frames:

- sender -> receiver: ``MAGIC`` + the 16-byte ticket `BulkOpen` returned (single use, expires), then
  exactly ``manifest.total_bytes`` payload bytes, no framing;
- receiver -> sender, once it holds the version or refused it: a 4-byte big-endian length + JSON
  ``{"ok": bool, "reason": str, "results": {address: outcome}}`` for itself and its subtree.

The ticket is what admits a connection: only a caller holding the job token (checked on `BulkOpen` by the
gRPC server's interceptor) ever learns one, over the job's TLS channel. In a secured job the bulk socket is
TLS too, with the same certificate and CA as the gRPC servers, so the sender checks it reaches the job's
server and the bytes are encrypted.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from decentralized_verl.errors import WireError

MAGIC = b"DVB1"
TICKET_BYTES = 16
HEADER_BYTES = len(MAGIC) + TICKET_BYTES
RECV_BYTES = 4 << 20
"""Most bytes one recv_into asks for: the kernel hands over whatever it has, up to this."""
SEND_BYTES = 4 << 20
"""Most bytes one sendall gets, so a receiver's verified prefix reaches its children in steady steps."""
REPLY_LIMIT = 1 << 20


# ------------------------------------------------------------------------------------------ TLS


def server_context(credentials: Any) -> ssl.SSLContext:
    """TLS server side with the job's certificate and key (PEM bytes; `ssl` reads them from files, so
    they pass through a private temporary file that is removed at once)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="dverl-bulk-") as folder:
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, data in ((cert, credentials.cert), (key, credentials.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert, key)
    return context


def client_context(credentials: Any) -> ssl.SSLContext:
    """TLS client side: the server must present a certificate of the job's CA valid for the host dialled."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the certificate and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=credentials.ca.decode())
    return context


def split_address(address: str) -> tuple[str, int]:
    """host and port of ``host:port`` (``[v6]:port`` too)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise WireError("address", f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def connect(host: str, port: int, tls: ssl.SSLContext | None, timeout_s: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


# ------------------------------------------------------------------------------------------ frames


def recv_exact(sock: socket.socket, n: int, what: str, peer: str) -> bytes:
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise WireError(what, f"{peer} closed the connection after {got} of {n} bytes")
        got += k
    return bytes(out)


def send_reply(sock: socket.socket, ok: bool, reason: str, results: dict[str, str]) -> None:
    body = json.dumps({"ok": ok, "reason": reason, "results": results}).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def read_reply(sock: socket.socket, peer: str) -> tuple[bool, str, dict[str, str]]:
    """The receiver's verdict; anything malformed is a `WireError` naming the peer."""
    (length,) = struct.unpack(">I", recv_exact(sock, 4, "bulk.reply", peer))
    if length > REPLY_LIMIT:
        raise WireError("bulk.reply", f"{peer} sent a {length}-byte reply (limit {REPLY_LIMIT})")
    try:
        reply = json.loads(recv_exact(sock, length, "bulk.reply", peer))
        results = {str(k): str(v) for k, v in reply["results"].items()}
        return bool(reply["ok"]), str(reply["reason"]), results
    except (ValueError, KeyError, TypeError, AttributeError):
        raise WireError("bulk.reply", f"{peer} sent a reply that is not the bulk verdict") from None


def peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "an unknown peer"
    return f"{host}:{port}"


# ------------------------------------------------------------------------------------------ payload


def _new_area(size: int) -> mmap.mmap:
    """Anonymous memory faulted in by one call (MAP_POPULATE, where there is one) rather than a page fault
    per 4 KiB as the socket fills it: ~0.1 s instead of ~0.2 s of CPU for 270 MB here. (Transparent huge
    pages were tried: 0.05 s when the kernel has them free, 0.7 s when it must compact memory first.)"""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


def _unviewed(area: mmap.mmap) -> bool:
    """Whether no view of ``area`` exists: an mmap refuses to resize while any buffer is exported."""
    try:
        area.resize(len(area))
    except BufferError:
        return False
    return True


class BufferPool:
    """Receive buffers for versions, reused once nothing views them any more.

    Why: a fresh 270 MB buffer costs the kernel ~66k page faults (~0.1-0.2 s of CPU here, more than
    hashing it), while a buffer reused costs nothing. A buffer is handed out again only when no view of it
    is left (the version it held was dropped by the publisher and nobody kept a chunk), which the mmap itself
    reports, so a held version's bytes are never overwritten; a reused buffer is overwritten in full by
    the socket before any of its chunks is hashed.
    """

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.reused = 0
        self._areas: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A writable buffer of exactly ``size`` bytes that no one else views."""
        if size <= 0:
            return memoryview(bytearray(0))
        with self._lock:  # the view is made inside the lock, so two takers never share an area
            for area in self._areas:
                if len(area) == size and _unviewed(area):
                    self.reused += 1
                    return memoryview(area)
            area = _new_area(size)
            view = memoryview(area)
            busy = [a for a in self._areas if not _unviewed(a)]
            self._areas = [*busy, area][-self.keep :]
            return view


@dataclass(frozen=True)
class Payload:
    """A version's bytes as contiguous segments (the learner's chunks, or a receiver's one buffer), so a
    byte range goes to a socket as memoryviews of what is held: no joining, no copies."""

    segments: tuple[memoryview, ...]
    starts: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, parts: Sequence[bytes | memoryview]) -> Payload:
        views = tuple(memoryview(p).cast("B") for p in parts)
        starts, at = [], 0
        for v in views:
            starts.append(at)
            at += len(v)
        return cls(views, tuple(starts), at)

    def views(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes [start, end) as views of at most SEND_BYTES each."""
        for seg, at in zip(self.segments, self.starts, strict=True):
            lo, hi = max(start, at), min(end, at + len(seg))
            for a in range(lo, hi, SEND_BYTES):
                yield seg[a - at : min(hi, a + SEND_BYTES) - at]
