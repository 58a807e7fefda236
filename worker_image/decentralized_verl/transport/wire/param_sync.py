"""Volunteer learners' parameter reconciliation: digests, chunks and the follower's confirmation.

The peer on the other side is another volunteer learner, so every message is checked against what
this side knows (the step, the chunk size, how many chunks the parameters cut into) before anything is
served or written; a violation raises WireError naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence

from decentralized_verl.transport.wire.common import WireError, pb

PARAM_DIGEST_SIZE = 16
"""blake2b-128 per chunk: 16 bytes, so one 4 MiB P2P message lists 64 GiB of parameters."""


def _epoch(msg, path: str = "epoch") -> int:
    if not msg.HasField("epoch"):
        raise WireError(path, "is missing")
    return msg.epoch


def _check_epoch(msg, expected: int) -> None:
    got = _epoch(msg)
    if got != expected:
        raise WireError("epoch", f"answers step {got}, step {expected} was asked for")


# ------------------------------------------------------------------------------------------- digests
def param_digests_request_to_proto(epoch: int) -> pb.ParamDigestsRequest:
    return pb.ParamDigestsRequest(epoch=epoch)


def param_digests_request_from_proto(msg: pb.ParamDigestsRequest) -> int:
    """The step asked about."""
    return _epoch(msg)


def param_digests_to_proto(epoch: int, chunk_bytes: int, digests: Sequence[bytes]) -> pb.ParamDigests:
    return pb.ParamDigests(epoch=epoch, chunk_bytes=chunk_bytes, digests=b"".join(digests))


def param_digests_from_proto(
    msg: pb.ParamDigests, *, epoch: int, chunk_bytes: int, chunks: int
) -> list[bytes]:
    """The leader's digests, once they answer `epoch`, cut chunks the same size and list `chunks` of them
    (a different count means a different model or dtype)."""
    _check_epoch(msg, epoch)
    if msg.chunk_bytes != chunk_bytes:
        raise WireError("chunk_bytes", f"{msg.chunk_bytes}-byte chunks, this learner cuts {chunk_bytes}")
    size = len(msg.digests)
    if size % PARAM_DIGEST_SIZE:
        raise WireError("digests", f"{size} bytes is not a whole number of {PARAM_DIGEST_SIZE}-byte digests")
    if size // PARAM_DIGEST_SIZE != chunks:
        raise WireError(
            "digests",
            f"{size // PARAM_DIGEST_SIZE} chunks at the leader, {chunks} here (different model or dtype?)",
        )
    return [msg.digests[k : k + PARAM_DIGEST_SIZE] for k in range(0, size, PARAM_DIGEST_SIZE)]


# -------------------------------------------------------------------------------------------- chunks
def param_chunks_request_to_proto(epoch: int, indices: Sequence[int]) -> pb.ParamChunksRequest:
    return pb.ParamChunksRequest(epoch=epoch, indices=indices)


def param_chunks_request_from_proto(msg: pb.ParamChunksRequest, *, chunks: int) -> tuple[int, list[int]]:
    """(epoch, indices): at least one index, each below `chunks`, strictly increasing (so no chunk is
    asked for twice and a request never outgrows one copy of the parameters)."""
    epoch = _epoch(msg)
    indices = list(msg.indices)
    if not indices:
        raise WireError("indices", "must not be empty")
    if len(indices) > chunks:
        raise WireError("indices", f"{len(indices)} asked for, the parameters have {chunks} chunks")
    previous = -1
    for i, k in enumerate(indices):
        if k >= chunks:
            raise WireError(f"indices[{i}]", f"chunk {k} is outside [0, {chunks})")
        if k <= previous:
            raise WireError(f"indices[{i}]", f"chunk {k} does not follow chunk {previous}")
        previous = k
    return epoch, indices


def param_chunk_to_proto(index: int, data: bytes) -> pb.ParamChunk:
    return pb.ParamChunk(index=index, data=data)


def param_chunk_from_proto(msg: pb.ParamChunk, *, index: int, size: int) -> bytes:
    """The chunk's bytes, once it is the chunk expected next and has its length (its digest is checked
    by the caller, which holds the leader's digests)."""
    if msg.index != index:
        raise WireError("index", f"chunk {msg.index} arrived, chunk {index} was expected next")
    if len(msg.data) != size:
        raise WireError("data", f"{len(msg.data)} bytes for chunk {index}, {size} expected")
    return msg.data


# -------------------------------------------------------------------------------------------- synced
def param_synced_request_to_proto(epoch: int) -> pb.ParamSyncedRequest:
    return pb.ParamSyncedRequest(epoch=epoch)


def param_synced_request_from_proto(msg: pb.ParamSyncedRequest) -> int:
    """The step the follower confirms."""
    return _epoch(msg)


def param_synced_reply_to_proto(epoch: int) -> pb.ParamSyncedReply:
    return pb.ParamSyncedReply(epoch=epoch)


def param_synced_reply_from_proto(msg: pb.ParamSyncedReply, *, epoch: int) -> None:
    """Checks that the leader acknowledged the step confirmed."""
    _check_epoch(msg, epoch)
