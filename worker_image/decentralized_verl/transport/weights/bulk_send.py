"""The sending half of the bulk weight plane: one version flowing out of a node to its children, each
child fed by its own thread from the node's verified bytes (see `transport.weights.bulk_plane`)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights import bulk_wire as bw
from decentralized_verl.transport.weights.push import OK, REASON_CHARS
from decentralized_verl.transport.weights.route import Hop

if TYPE_CHECKING:
    from decentralized_verl.transport.weights.node import RelayNode

log = logging.getLogger(__name__)

BULK_UNAVAILABLE = "bulk unavailable"
"""The start of a child's outcome when it has no bulk plane: the caller may push to it over gRPC instead."""
NO_LISTENER = "this relay has no bulk listener"


class SendingPlane(Protocol):
    """What the sending threads use of their node's bulk plane (`bulk_plane.BulkPlane`)."""

    relay: RelayNode

    @property
    def client_tls(self) -> Any:
        """The TLS context a data connection opens with; None in a job without credentials."""
        ...

    def offer(self, hop: Hop, manifest_bytes: bytes) -> tuple[int, bytes]:
        """``BulkOpen`` on ``hop``: its bulk port and a ticket."""
        ...


class Aborted(Exception):
    """The session feeding a downstream ended before all bytes were verified."""


class BulkSession:
    """One version flowing out of this node over the bulk plane: a byte prefix verified so far (all of it
    on the learner) and a sending thread per child, adopting the children of one that fails."""

    def __init__(
        self, plane: SendingPlane, manifest: m.WeightManifest, payload: bw.Payload, ready: int
    ) -> None:
        self.plane = plane
        self.payload = payload
        self.manifest_bytes = m.manifest_to_proto(manifest).SerializeToString()
        self.downstreams: list[BulkDownstream] = []
        self._ready = ready
        self._aborted: str | None = None
        self._cond = threading.Condition()

    def open(self, hop: Hop) -> None:
        downstream = BulkDownstream(self, hop)
        with self._cond:
            if self._aborted is not None:
                return
            self.downstreams.append(downstream)
        downstream.start()

    def advance(self, upto: int) -> None:
        with self._cond:
            self._ready = max(self._ready, upto)
            self._cond.notify_all()

    def wait_ready(self, sent: int) -> int:
        """The verified prefix once it is longer than ``sent``; `Aborted` when the session ended."""
        with self._cond:
            while self._ready <= sent and self._aborted is None:
                self._cond.wait()
            if self._aborted is not None:
                raise Aborted(self._aborted)
            return self._ready

    def abort(self, hops: Iterable[Hop], reason: str) -> dict[str, str]:
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()
            downstreams = list(self.downstreams)
        for d in downstreams:
            d.cancel()
        self._let_go()
        return {a: f"not sent: {reason}"[:REASON_CHARS] for h in hops for a in h.addresses()}

    def finish(self, timeout_s: float | None = None) -> dict[str, str]:
        """Wait for every child (and adopted grandchild); one silent past ``timeout_s`` is cut off."""
        until = None if timeout_s is None else time.monotonic() + timeout_s
        results: dict[str, str] = {}
        seen = 0
        while True:
            with self._cond:
                if seen >= len(self.downstreams):
                    break
                d = self.downstreams[seen]
            d.join(None if until is None else max(0.0, until - time.monotonic()))
            if d.is_alive():
                d.cancel()
                log.warning("bulk fan-out: %s gave no answer in %.0f s; cut off", d.hop.address, timeout_s)
                outcomes = {a: f"not sent: no answer in {timeout_s:.0f} s" for a in d.hop.addresses()}
            else:
                outcomes = d.outcome
            for address, outcome in outcomes.items():
                if results.get(address) != OK:
                    results[address] = outcome
            seen += 1
        self._let_go()
        return results

    def _let_go(self) -> None:
        """Forget the sending threads once the session is over. Each thread holds the session, so the
        session holding them is a reference cycle: only the cyclic collector would free it, and until then
        the payload's views keep a relay's receive buffer from being reused (a fresh 270 MB buffer per
        version: page faults and memory growth on every relay but the last)."""
        with self._cond:
            self.downstreams = []


class BulkDownstream(threading.Thread):
    """Sends one child the session's verified bytes as they become ready, then reads its verdict."""

    def __init__(self, session: BulkSession, hop: Hop) -> None:
        super().__init__(daemon=True, name=f"bulk-send-{hop.address}")
        self.session = session
        self.hop = hop
        self.outcome: dict[str, str] = {}
        self._sock: socket.socket | None = None
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        try:
            self.outcome = self._deliver()
        except Exception as exc:  # a bug must not leave the session waiting on a silent thread
            log.exception("bulk fan-out to %s", self.hop.address)
            self.outcome = {a: f"failed: {exc}"[:REASON_CHARS] for a in self.hop.addresses()}

    def _deliver(self) -> dict[str, str]:
        session, plane, hop = self.session, self.session.plane, self.hop
        try:
            port, ticket = plane.offer(hop, session.manifest_bytes)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.UNIMPLEMENTED or NO_LISTENER in details:
                return self._answer(False, f"{BULK_UNAVAILABLE}: {details or code.name}", {})
            return self._answer(False, f"{code.name}: {details}", {})
        try:
            host = bw.split_address(hop.address)[0]
            self._sock = bw.connect(host, port, plane.client_tls, plane.relay.timeout_s)
        except OSError as exc:
            return self._answer(False, f"{BULK_UNAVAILABLE}: cannot connect to port {port} ({exc})", {})
        sock = self._sock
        try:
            sock.sendall(bw.MAGIC + ticket)
            sent, total = 0, session.payload.total
            while sent < total:
                upto = session.wait_ready(sent)
                for piece in session.payload.views(sent, upto):
                    sock.sendall(piece)
                    sent += len(piece)
            ok, reason, results = bw.read_reply(sock, hop.address)
        except Aborted as exc:
            return {a: f"not sent: {exc}"[:REASON_CHARS] for a in hop.addresses()}
        except (OSError, WireError) as exc:
            if self._cancelled:
                return {a: "cancelled" for a in hop.addresses()}
            ok, reason, results = False, f"bulk stream to {hop.address} broke: {exc}", {}
        finally:
            sock.close()
        return self._answer(ok, reason, results)

    def _answer(self, ok: bool, reason: str, results: dict[str, str]) -> dict[str, str]:
        results[self.hop.address] = OK if ok else f"failed: {reason}"[:REASON_CHARS]
        if not ok and not self._cancelled:
            log.warning("bulk fan-out: %s skipped (%s); adopting its children", self.hop.address, reason)
            for child in self.hop.children:  # skip the broken node: its parent feeds its children
                if results.get(child.address) != OK:
                    self.session.open(child)
        return results
