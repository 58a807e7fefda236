"""The bulk weight plane over real sockets on 127.0.0.1: gRPC BulkOpen for the signed manifest, then raw TCP
(TLS in a secured job) into one buffer per receiver. A chain of 3 receivers gets identical verified weights,
a corrupted, a truncated and a wrong-hash payload are refused with an error naming the peer (nothing is
held), a worker without the bulk plane gets a gRPC push instead, and the same holds with TLS and signatures.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from decentralized_verl.security import credentials as cr
from decentralized_verl.security import trust
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights import bulk_wire as bw
from decentralized_verl.transport.weights.bulk_plane import BulkPlane
from decentralized_verl.transport.weights.fanout import WeightFanout
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.push import OK
from decentralized_verl.transport.weights.receive import LocalWeightSource
from decentralized_verl.transport.weights.relay import WeightRelay
from decentralized_verl.transport.weights.route import Hop, plan_chain
from decentralized_verl.transport.weights.service import WeightsServicer
from tests.support.relays import CHUNK, RelayThread, model_state


@pytest.fixture()
def nodes():
    started: list[RelayThread] = []

    def start(relay: WeightRelay | None = None) -> RelayThread:
        started.append(RelayThread(relay))
        return started[-1]

    yield start
    for node in started:
        node.stop()


def same_weights(a: RelayThread, b: RelayThread, version: int) -> bool:
    got = LocalWeightSource(a.relay.publisher, wait_s=0).fetch_latest(version)[1]
    want = LocalWeightSource(b.relay.publisher, wait_s=0).fetch_latest(version)[1]
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def wait_idle(node: RelayThread) -> None:
    """The receiver's bookkeeping is settled (its handler thread reports on the event loop)."""
    deadline = time.monotonic() + 5
    while node.relay.receiving and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not node.relay.receiving


def test_a_chain_of_three_gets_the_version_through_the_bulk_plane(nodes) -> None:
    learner = nodes()
    receivers = [nodes() for _ in range(3)]
    learner.relay.publish(model_state(), 1)
    route = plan_chain([r.address for r in receivers])
    results = learner.call(learner.relay.fan_out_bulk(1, route))
    assert results == {r.address: OK for r in receivers}
    for r in receivers:
        held = r.relay.publisher.get(1)
        assert held.manifest == learner.relay.publisher.get(1).manifest
        assert isinstance(held.bundle.chunks[0].data, memoryview)  # views of the one buffer, not gRPC bytes
        assert r.relay.pushes_received == 0 and same_weights(r, learner, 1)
        wait_idle(r)
    # a version received in bulk is served on to a puller over gRPC like any other
    late = nodes()
    assert late.call(late.relay.catch_up(receivers[-1].address, 1)) == 1 and same_weights(late, learner, 1)


class CorruptingLink:
    """A TCP link in user space to one child's bulk port that flips one payload byte on its way, after the
    sending relay verified it (bad RAM on the way out, a faulty NIC): one connection, both directions
    pumped, the child's verdict carried back."""

    def __init__(self, target_port: int, flip_at: int) -> None:
        self.target_port = target_port
        self.flip_at = bw.HEADER_BYTES + flip_at  # the connection opens with the magic and the ticket
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flipped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener:
            sender, _ = self.listener.accept()
        child = socket.create_connection(("127.0.0.1", self.target_port))
        back = threading.Thread(target=self._pump, args=(child, sender, False), daemon=True)
        back.start()
        self._pump(sender, child, True)
        back.join(30)
        sender.close()
        child.close()

    def _pump(self, source: socket.socket, sink: socket.socket, corrupt: bool) -> None:
        offset = 0
        try:
            while data := source.recv(65536):
                if corrupt and offset <= self.flip_at < offset + len(data):
                    data = bytearray(data)
                    data[self.flip_at - offset] ^= 0xFF
                    self.flipped = True
                offset += len(data)
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class LinkedPlane(BulkPlane):
    """A bulk plane whose data connections to ``child`` go through a `CorruptingLink`."""

    def __init__(self, relay: WeightRelay, child: str, flip_at: int) -> None:
        super().__init__(relay)
        self.child, self.flip_at = child, flip_at
        self.links: list[CorruptingLink] = []

    def offer(self, hop: Hop, manifest_bytes: bytes) -> tuple[int, bytes]:
        port, ticket = super().offer(hop, manifest_bytes)
        if hop.address != self.child:
            return port, ticket
        self.links.append(CorruptingLink(port, self.flip_at))
        return self.links[-1].port, ticket


class CorruptingRelay(WeightRelay):
    """A relay whose bulk link to ``child`` flips the payload byte at ``flip_at``."""

    def __init__(self, child: str, flip_at: int) -> None:
        super().__init__(WeightPublisher(chunk_bytes=CHUNK))
        self.bulk = LinkedPlane(self, child, flip_at)


def test_a_chunk_corrupted_at_a_relay_is_refused_by_its_child_naming_the_peer(nodes) -> None:
    learner = nodes()
    r2, r3 = nodes(), nodes()
    r1 = nodes(CorruptingRelay(r2.address, flip_at=CHUNK + CHUNK // 2))
    learner.relay.publish(model_state(), 1)
    results = learner.call(learner.relay.fan_out_bulk(1, plan_chain([r1.address, r2.address, r3.address])))
    assert [link.flipped for link in r1.relay.bulk.links] == [True]
    assert results[r1.address] == OK and results[r3.address] == OK  # r1 adopted r3
    assert "digest mismatch in the bytes from 127.0.0.1:" in results[r2.address]
    assert r2.relay.publisher.get(1) is None and "chunk[1]" in r2.relay.bulk.refused[-1]
    assert same_weights(r3, learner, 1) and same_weights(r1, learner, 1)
    wait_idle(r2)


def raw_send(node: RelayThread, manifest: m.WeightManifest, payload: bytes) -> tuple[bool, str]:
    """A hand-driven sender: BulkOpen, then ``payload`` (closing early when it is short)."""
    port, ticket = node.relay.bulk.offer(Hop(node.address), m.manifest_to_proto(manifest).SerializeToString())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(bw.MAGIC + ticket + payload)
        if len(payload) < manifest.total_bytes:
            sock.shutdown(socket.SHUT_WR)
            return False, ""
        ok, reason, _ = bw.read_reply(sock, node.address)
        return ok, reason


def test_truncated_and_wrong_hash_payloads_are_refused_naming_the_peer(nodes) -> None:
    receiver = nodes()
    publisher = WeightPublisher(chunk_bytes=CHUNK)
    manifest = publisher.publish(model_state(0), 1)
    payload = publisher.get(1).bundle.payload()
    raw_send(receiver, manifest, payload[: len(payload) // 2])
    deadline = time.monotonic() + 5
    while not receiver.relay.bulk.refused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (
        f"ended the stream after {len(payload) // 2} of {len(payload)} bytes"
        in receiver.relay.bulk.refused[-1]
    )
    assert "127.0.0.1:" in receiver.relay.bulk.refused[-1]
    other = WeightPublisher(chunk_bytes=CHUNK)
    other.publish(model_state(1), 1)  # same shapes, other values: every chunk hashes differently
    ok, reason = raw_send(receiver, manifest, other.get(1).bundle.payload())
    assert (
        not ok
        and "weights[v1].chunk[0]" in reason
        and "digest mismatch in the bytes from 127.0.0.1:" in reason
    )
    assert receiver.relay.publisher.get(1) is None
    ok, reason = raw_send(receiver, manifest, payload)  # the right bytes still pass afterwards
    assert ok and reason == "" and receiver.relay.publisher.get(1) is not None
    wait_idle(receiver)


async def test_a_worker_without_the_bulk_plane_is_pushed_to_over_grpc(nodes) -> None:
    from decentralized_verl.transport.secure import aio_server, bind

    old = WeightPublisher(chunk_bytes=CHUNK)  # an older build: the Weights service without BulkOpen
    server = aio_server()
    from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc

    pb_grpc.add_WeightsServicer_to_server(WeightsServicer(old), server)
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    new = nodes()
    fanout = WeightFanout(WeightPublisher(chunk_bytes=CHUNK), [f"127.0.0.1:{port}", new.address])
    try:
        results = await fanout.publish(model_state(), 1)
        assert results == {f"127.0.0.1:{port}": OK, new.address: OK}
        assert old.get(1) is not None and new.relay.publisher.get(1) is not None
        assert new.relay.pushes_received == 0  # the bulk plane served it
    finally:
        await fanout.close()
        await server.stop(None)


# ------------------------------------------------------------------------------------ secured job


@pytest.fixture()
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> cr.JobCredentials:
    """This test process is one of the job's rollout workers (TLS, its token, signed weights only); the
    credentials returned are the learner's."""
    issued = cr.run_folder_credentials(tmp_path / "run", "bulk-job").issued
    monkeypatch.setattr(trust, "_given", str(cr.write(tmp_path / "rollout", issued, "rollout")))
    return issued.for_role("learner")


def test_with_tls_signed_weights_cross_a_chain_and_forged_ones_do_not(job, nodes) -> None:
    learner = nodes(
        WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key), credentials=job)
    )
    receivers = [nodes() for _ in range(3)]
    assert receivers[0].relay.bulk.client_tls is not None  # the job's TLS, not plaintext
    learner.relay.publish(model_state(), 1)
    route = plan_chain([r.address for r in receivers])
    assert learner.call(learner.relay.fan_out_bulk(1, route)) == {r.address: OK for r in receivers}
    assert all(same_weights(r, learner, 1) for r in receivers)
    # the learner's own key is the only one a receiver accepts; without the job token nothing is opened
    rogue = nodes(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=None), credentials=job))
    rogue.relay.publish(model_state(1), 2)
    results = rogue.call(rogue.relay.fan_out_bulk(2, plan_chain([receivers[0].address])))
    assert (
        "INVALID_ARGUMENT" in results[receivers[0].address] and "signature" in results[receivers[0].address]
    )
    stranger = nodes(
        WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key), credentials=None)
    )
    stranger.relay.publish(model_state(1), 3)
    results = stranger.call(stranger.relay.fan_out_bulk(3, plan_chain([receivers[0].address])))
    assert "failed: UNAVAILABLE" in results[receivers[0].address]  # no TLS, no token: not even BulkOpen
    assert [r.relay.publisher.versions for r in receivers] == [[1]] * 3
    # a connection no BulkOpen announced is closed as it is accepted: no TLS, no thread, no ticket read
    with socket.create_connection(("127.0.0.1", receivers[0].relay.bulk.port)) as sock:
        sock.sendall(bw.MAGIC + b"\0" * bw.TICKET_BYTES)
        sock.settimeout(5)
        try:
            answer = sock.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert answer == b""


def test_idle_connections_cost_no_thread_and_an_announced_one_a_short_deadline(nodes, monkeypatch) -> None:
    """A flood of TCP connections to the bulk port: none gets a thread while no ticket is open; with one
    open, at most a few do, each dropped when its header does not come within the deadline."""
    import threading

    from decentralized_verl.transport.weights import bulk_plane as bulk_relay

    monkeypatch.setattr(bulk_relay, "HEADER_DEADLINE_S", 0.5)
    receiver = nodes()
    port = receiver.relay.bulk.port
    before = threading.active_count()
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    try:
        for sock in flood:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the receiver, unread
        assert threading.active_count() <= before + 1
    finally:
        for sock in flood:
            sock.close()
    # an open ticket (as BulkOpen makes): a few connections are served, the rest closed at once
    plane = receiver.relay.bulk
    with plane._lock:
        plane._pending[b"t" * bw.TICKET_BYTES] = None  # type: ignore[assignment]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        closed = 0
        for sock in idle:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # at once, or after the header deadline
            closed += 1
        assert closed == 20 and plane._serving <= 4
        deadline = time.monotonic() + 5
        while plane._serving and time.monotonic() < deadline:
            time.sleep(0.01)
        assert plane._serving == 0
        assert any("bulk.header" in r or "timed out" in r for r in plane.refused)
    finally:
        for sock in idle:
            sock.close()


def test_relays_reuse_their_receive_buffer_for_the_next_version_without_the_cyclic_collector(nodes) -> None:
    """A relay forwards from its receive buffer; once a version is replaced, that buffer must be free for
    the next one through plain reference counting, on every node of the chain."""
    learner = nodes(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, keep=1)))
    receivers = [nodes(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, keep=1))) for _ in range(3)]
    route = plan_chain([r.address for r in receivers])
    gc.disable()
    try:
        for version in range(1, 5):
            learner.relay.publish(model_state(), version)
            results = learner.call(learner.relay.fan_out_bulk(version, route))
            assert results == {r.address: OK for r in receivers}
            for r in receivers:
                wait_idle(r)
    finally:
        gc.enable()
    for r in receivers:
        assert same_weights(r, learner, 4)
        assert r.relay.bulk.buffers.reused >= 2, r.address  # two buffers alternate: held and arriving
