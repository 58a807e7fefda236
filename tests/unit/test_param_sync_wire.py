"""Parameter reconciliation's messages are checked on receipt, at both ends, over real hivemind P2P.

A leader refuses malformed, oversized and wrong-step requests from a member, and every request from a peer
outside the step's group, naming the field and the peer, and stays blocked until the real follower
confirms. A follower refuses a leader whose digests or chunks break the contract, naming the field and the
leader, and keeps its parameters as they were (even chunks that arrived intact before a bad one).

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m

CHUNK = 256
EPOCH = 5


# ------------------------------------------------------------------------------------ pure checks
def test_digest_replies_must_answer_the_step_with_our_layout() -> None:
    digests = [bytes([i]) * m.PARAM_DIGEST_SIZE for i in range(3)]
    msg = m.param_digests_to_proto(EPOCH, CHUNK, digests)
    assert m.param_digests_from_proto(msg, epoch=EPOCH, chunk_bytes=CHUNK, chunks=3) == digests
    bad = [
        (pb.ParamDigests(chunk_bytes=CHUNK, digests=b"".join(digests)), "epoch: is missing"),
        (m.param_digests_to_proto(EPOCH - 1, CHUNK, digests), "epoch: answers step 4, step 5"),
        (m.param_digests_to_proto(EPOCH, CHUNK * 2, digests), "chunk_bytes: 512-byte chunks"),
        (pb.ParamDigests(epoch=EPOCH, chunk_bytes=CHUNK, digests=b"x" * 37), "digests: 37 bytes is not"),
        (m.param_digests_to_proto(EPOCH, CHUNK, digests[:2]), "digests: 2 chunks at the leader, 3 here"),
        (m.param_digests_to_proto(EPOCH, CHUNK, digests * 2), "digests: 6 chunks at the leader"),
    ]
    for msg, error in bad:
        with pytest.raises(WireError, match=error):
            m.param_digests_from_proto(msg, epoch=EPOCH, chunk_bytes=CHUNK, chunks=3)


def test_chunk_requests_name_each_chunk_once_inside_the_layout() -> None:
    assert m.param_chunks_request_from_proto(m.param_chunks_request_to_proto(0, [0, 2]), chunks=3) == (
        0,
        [0, 2],
    )
    bad = [
        (pb.ParamChunksRequest(indices=[0]), "epoch: is missing"),
        (pb.ParamChunksRequest(epoch=1), "indices: must not be empty"),
        (pb.ParamChunksRequest(epoch=1, indices=[3]), r"indices\[0\]: chunk 3 is outside \[0, 3\)"),
        (pb.ParamChunksRequest(epoch=1, indices=[0, 1, 2, 2]), "indices: 4 asked for, the parameters have 3"),
        (pb.ParamChunksRequest(epoch=1, indices=[1, 1]), r"indices\[1\]: chunk 1 does not follow chunk 1"),
        (pb.ParamChunksRequest(epoch=1, indices=[2, 0]), r"indices\[1\]: chunk 0 does not follow chunk 2"),
    ]
    for msg, error in bad:
        with pytest.raises(WireError, match=error):
            m.param_chunks_request_from_proto(msg, chunks=3)


def test_chunks_and_confirmations_are_checked() -> None:
    assert m.param_chunk_from_proto(m.param_chunk_to_proto(2, b"abc"), index=2, size=3) == b"abc"
    with pytest.raises(WireError, match="index: chunk 1 arrived, chunk 2 was expected"):
        m.param_chunk_from_proto(m.param_chunk_to_proto(1, b"abc"), index=2, size=3)
    with pytest.raises(WireError, match="data: 4 bytes for chunk 2, 3 expected"):
        m.param_chunk_from_proto(m.param_chunk_to_proto(2, b"abcd"), index=2, size=3)
    assert m.param_synced_request_from_proto(m.param_synced_request_to_proto(0)) == 0  # step 0 is a step
    with pytest.raises(WireError, match="epoch: is missing"):
        m.param_synced_request_from_proto(pb.ParamSyncedRequest())
    with pytest.raises(WireError, match="epoch: is missing"):
        m.param_digests_request_from_proto(pb.ParamDigestsRequest())
    m.param_synced_reply_from_proto(m.param_synced_reply_to_proto(3), epoch=3)
    with pytest.raises(WireError, match="epoch: answers step 2, step 3"):
        m.param_synced_reply_from_proto(m.param_synced_reply_to_proto(2), epoch=3)
