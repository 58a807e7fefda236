"""Parameter reconciliation's messages are checked on receipt, at both ends, over real hivemind P2P.

A leader refuses malformed, oversized and wrong-step requests from a member, and every request from a peer
outside the step's group, naming the field and the peer, and stays blocked until the real follower
confirms. A follower refuses a leader whose digests or chunks break the contract, naming the field and the
leader, and keeps its parameters as they were (even chunks that arrived intact before a bad one).

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from decentralized_verl.errors import VolunteerError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers.param_sync import (
    CHUNKS,
    DIGESTS,
    SYNCED,
    ParameterSync,
    byte_views,
    chunk_bytes_of,
    chunk_digests,
    chunk_layout,
)

pytestmark = pytest.mark.usefixtures("collected_before_fork")

CHUNK = 256
EPOCH = 5


# ------------------------------------------------------------------------------------- real P2P
@dataclass
class Peer:
    """A DHT with its own P2P client, served by an event loop in a thread (as a volunteer learner has)."""

    dht: object
    p2p: object
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def id(self) -> str:
        return self.dht.peer_id.to_base58()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _start(initial_peers: list[str]) -> Peer:
    import hivemind

    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=initial_peers)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="param-sync-test", daemon=True)
    thread.start()
    p2p = asyncio.run_coroutine_threadsafe(dht.replicate_p2p(), loop).result(60)
    return Peer(dht, p2p, loop, thread)


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[Peer, Peer, Peer]]:
    """Leader, follower and an outsider (never a member of the group)."""
    first = _start([])
    maddrs = [str(a) for a in first.dht.get_visible_maddrs()]
    started = [first]
    try:
        started += [_start(maddrs), _start(maddrs)]
        yield tuple(started)
    finally:
        for peer in reversed(started):
            try:
                peer.run(peer.p2p.shutdown(), 10)
            finally:
                peer.loop.call_soon_threadsafe(peer.loop.stop)
                peer.thread.join(10)
                peer.dht.shutdown()


def _tensors() -> list[torch.Tensor]:
    return [torch.linspace(-1, 1, 300), torch.arange(10, dtype=torch.float32)]  # 6 chunks of <= 256 bytes


def _nudged(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy one ulp off in chunk 3 (float 250 lives in bytes 1000..1004), like all-reduce leaves it."""
    out = [t.clone() for t in tensors]
    out[0][250] = torch.nextafter(out[0][250], torch.tensor(2.0))
    return out


def _call(peer: Peer, to: str, name: str, request, reply_type):
    from decentralized_verl.transport.p2p import peer as peer_id

    return peer.run(peer.p2p.call_protobuf_handler(peer_id(to), name, request, reply_type))


def _stream(peer: Peer, to: str, name: str, request, reply_type) -> list:
    from decentralized_verl.transport.p2p import peer as peer_id

    async def read() -> list:
        return [
            msg
            async for msg in await peer.p2p.iterate_protobuf_handler(peer_id(to), name, request, reply_type)
        ]

    return peer.run(read())


def test_a_leader_refuses_bad_requests_and_waits_for_the_real_confirmation(peers) -> None:
    leader, follower, outsider = peers
    ours, theirs = _tensors(), _nudged(_tensors())
    lead = ParameterSync(leader.p2p, leader.loop, leader.id, ours, chunk_bytes=CHUNK, timeout_s=60)
    follow = ParameterSync(follower.p2p, follower.loop, follower.id, theirs, chunk_bytes=CHUNK, timeout_s=60)
    lead.register()
    follow.register()
    failure: list[BaseException] = []

    def leading() -> None:
        try:
            lead.lead(EPOCH, [leader.id, follower.id])
        except BaseException as exc:  # reported by the assertion below
            failure.append(exc)

    thread = threading.Thread(target=leading, daemon=True)
    thread.start()
    with lead._lock:
        assert lead._lock.wait_for(lambda: lead._epoch == EPOCH, timeout=30)

    replies = {DIGESTS: pb.ParamDigests, CHUNKS: pb.ParamChunk, SYNCED: pb.ParamSyncedReply}
    what = {DIGESTS: "Digests request", CHUNKS: "Chunks request", SYNCED: "Synced"}
    bad_member_requests = [
        (DIGESTS, pb.ParamDigestsRequest(), "epoch: is missing"),
        (CHUNKS, pb.ParamChunksRequest(epoch=EPOCH, indices=[6]), r"indices\[0\]: chunk 6 is outside"),
        (CHUNKS, pb.ParamChunksRequest(epoch=EPOCH, indices=list(range(7))), "indices: 7 asked for"),
        (
            CHUNKS,
            pb.ParamChunksRequest(epoch=EPOCH, indices=[3, 3]),
            r"indices\[1\]: chunk 3 does not follow",
        ),
        (CHUNKS, pb.ParamChunksRequest(epoch=EPOCH), "indices: must not be empty"),
        (SYNCED, pb.ParamSyncedRequest(), "epoch: is missing"),
    ]
    for name, request, error in bad_member_requests:
        ask = _stream if name == CHUNKS else _call
        with pytest.raises(Exception, match=f"{what[name]} from peer {follower.id} refused: {error}"):
            ask(follower, leader.id, name, request, replies[name])
    with pytest.raises(Exception, match=f"step {EPOCH - 1} is over"):
        _call(follower, leader.id, SYNCED, m.param_synced_request_to_proto(EPOCH - 1), pb.ParamSyncedReply)
    for name, request, reply_type in [
        (DIGESTS, m.param_digests_request_to_proto(EPOCH), pb.ParamDigests),
        (SYNCED, m.param_synced_request_to_proto(EPOCH), pb.ParamSyncedReply),
    ]:
        with pytest.raises(Exception, match=f"peer {outsider.id} is not a follower"):
            _call(outsider, leader.id, name, request, reply_type)
    with pytest.raises(Exception, match=f"peer {outsider.id} is not a follower"):
        _stream(outsider, leader.id, CHUNKS, m.param_chunks_request_to_proto(EPOCH, [0]), pb.ParamChunk)

    with lead._lock:
        assert lead._synced == set()  # no refused call counted as a confirmation
    assert thread.is_alive()  # so the leader still waits
    result = follow.follow(leader.id, EPOCH)
    thread.join(60)
    assert not thread.is_alive() and failure == []
    assert (result.chunks, result.fetched, result.bytes_fetched) == (6, 1, CHUNK)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


ROGUE_MODES = {
    "wrong step": "Digests from peer {leader} refused: epoch: answers step 4, step 5",
    "other model": "Digests from peer {leader} refused: digests: 5 chunks at the leader, 6 here",
    "torn digests": "Digests from peer {leader} refused: digests: 95 bytes is not",
    "chunk out of order": "Chunk from peer {leader} refused: index: chunk 5 arrived, chunk 3 was expected",
    "short chunk": "Chunk from peer {leader} refused: data: 255 bytes for chunk 3, 256 expected",
    "corrupt chunk": r"chunk \(1, 0, 40\): digest mismatch",
    "extra chunk": "leader {leader} sent more chunks than the 2 asked for",
    "missing chunk": "leader {leader} sent 1 of 2 chunks",
    "wrong ack": "Synced reply from peer {leader} refused: epoch: answers step 4, step 5",
}


def test_a_follower_refuses_a_bad_leader_and_keeps_its_parameters(peers) -> None:
    _, follower, rogue = peers
    truth = _tensors()
    truth[1][9] = 99.0  # the last chunk differs too, so the follower asks for chunks 3 and 5
    views = byte_views(truth)
    layout = chunk_layout(views, CHUNK)
    digests = chunk_digests(views, layout)
    mode = {"now": ""}

    async def digests_handler(request, context) -> pb.ParamDigests:
        now = mode["now"]
        if now == "wrong step":
            return m.param_digests_to_proto(EPOCH - 1, CHUNK, digests)
        if now == "other model":
            return m.param_digests_to_proto(EPOCH, CHUNK, digests[:5])
        if now == "torn digests":
            return pb.ParamDigests(epoch=EPOCH, chunk_bytes=CHUNK, digests=b"".join(digests)[:-1])
        return m.param_digests_to_proto(EPOCH, CHUNK, digests)

    async def chunks_handler(request, context):
        now = mode["now"]
        sent = [(k, chunk_bytes_of(views, layout[k])) for k in request.indices]
        if now == "chunk out of order":
            sent.reverse()
        elif now == "short chunk":
            sent[0] = (sent[0][0], sent[0][1][:-1])
        elif now == "corrupt chunk":
            sent[-1] = (sent[-1][0], bytes(len(sent[-1][1])))  # after an intact chunk 3
        elif now == "extra chunk":
            sent.append(sent[0])
        elif now == "missing chunk":
            sent = sent[:1]
        for k, data in sent:
            yield m.param_chunk_to_proto(k, data)

    async def synced_handler(request, context) -> pb.ParamSyncedReply:
        return m.param_synced_reply_to_proto(EPOCH - 1 if mode["now"] == "wrong ack" else request.epoch)

    async def register() -> None:
        await rogue.p2p.add_protobuf_handler(DIGESTS, digests_handler, pb.ParamDigestsRequest)
        await rogue.p2p.add_protobuf_handler(
            CHUNKS, chunks_handler, pb.ParamChunksRequest, stream_output=True
        )
        await rogue.p2p.add_protobuf_handler(SYNCED, synced_handler, pb.ParamSyncedRequest)

    rogue.run(register())
    mine = _nudged(_tensors())
    before = [t.clone() for t in mine]
    sync = ParameterSync(follower.p2p, follower.loop, follower.id, mine, chunk_bytes=CHUNK, timeout_s=30)
    for name, error in ROGUE_MODES.items():
        mode["now"] = name
        with pytest.raises(VolunteerError, match=error.format(leader=rogue.id)):
            sync.follow(rogue.id, EPOCH)
        if name != "wrong ack":  # a bad acknowledgement comes after the leader's checked bytes were written
            assert all(torch.equal(a, b) for a, b in zip(mine, before, strict=True)), name
        with torch.no_grad():
            for a, b in zip(mine, before, strict=True):
                a.copy_(b)  # in place: the sync's views share these tensors' storage
    mode["now"] = ""
    result = sync.follow(rogue.id, EPOCH)
    assert (result.fetched, result.bytes_fetched) == (2, CHUNK + 40)
    assert all(torch.equal(a, b) for a, b in zip(mine, truth, strict=True))
