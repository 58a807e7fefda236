"""Weights to volunteers over real Hivemind P2P: deltas against the version a volunteer holds, full bundles
when there is no chain, and transfers that resume from the last verified piece or chunk after a drop.

In-process: two real DHT peers; the coordinator's handlers on one, the volunteer's source on the other.
Versions come from real Adam steps; every received version is compared with the learner's own bytes.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.delta_p2p import cut, uncut
from decentralized_verl.transport.weights.codec import encode_state_dict
from decentralized_verl.transport.weights.publish import manifest_of
from decentralized_verl.transport.weights.receive import ChunkFetch
from tests.support.weight_states import trained_states


def test_a_fetch_resumes_as_long_as_each_stream_brings_new_chunks() -> None:
    bundle = encode_state_dict(trained_states(lr=1e-5, steps=0)[0], 0, chunk_bytes=4096)
    fetch = ChunkFetch(manifest_of(bundle), "learner", verify_key=None)

    def deliver(index: int) -> None:
        chunk = bundle.chunks[index]
        fetch.builder.add(
            m.chunk_to_proto(m.WeightChunk(0, index, len(bundle.chunks), chunk.data, chunk.digest))
        )

    fetch.failed("dropped before anything")  # the first drop is always forgiven
    for index in range(3):
        deliver(index)
        fetch.failed(f"dropped after chunk {index}")  # each of these brought a chunk: resume again
    assert fetch.next_start() == 3
    with pytest.raises(WireError, match=r"failed 5 times: .*dropped after chunk 2; nothing"):
        fetch.failed("nothing")  # a drop that brought nothing new after an earlier drop: give up


def test_pieces_rebuild_frames_and_bad_headers_are_named() -> None:
    frames = [b"a" * 5000, b"b" * 3000]
    header, pieces = cut(frames, piece_bytes=1024)
    assert uncut(header, dict(enumerate(pieces))) == frames
    with pytest.raises(WireError, match=r"pieces \[2\]"):
        uncut(header, {i: p for i, p in enumerate(pieces) if i != 2})
    with pytest.raises(WireError, match="do not add up"):
        uncut({**header, "frames": [5000, 2999]}, dict(enumerate(pieces)))
    with pytest.raises(WireError, match="malformed"):
        uncut({"digests": []}, {})
