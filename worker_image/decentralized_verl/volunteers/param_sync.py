"""Leader-wins parameter reconciliation: after an averaged step, every learner holds the leader's exact bytes.

Why: hivemind's all-reduce hands each peer `average - local` for the parts other peers reduced, and the
peer adds it to its own copy; `local + (average - local)` is not `average` in float arithmetic, so peers
end a step a few ulps apart (and drift further over many steps). Exact averaging would need an
all-gather (every peer receives every gradient: N times the traffic). Instead, after the step, each
follower compares per-chunk digests of its parameters with the group's leader (the smallest peer id of
the averaging group, which every member computes the same way) and fetches only the chunks that
differ, each hash-checked. The differences are rounding, so in practice a handful of chunks move; the
worst case is one model-size transfer. The leader blocks until every follower has confirmed, so the
bytes it serves cannot change underneath a fetch, and the group leaves the step in lockstep.

Wire: three hivemind P2P handlers on the learner's DHT peer (the averaging group already connected the
members). Only members of the current step's group may call them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import torch
from google.protobuf import wrappers_pb2

from decentralized_verl.errors import VolunteerError

DIGESTS = "dverl.Learner/Digests"
CHUNKS = "dverl.Learner/Chunks"
SYNCED = "dverl.Learner/Synced"
CHUNK_BYTES = 1 << 18
DIGEST_SIZE = 16
"""blake2b-128 per chunk: 16 bytes, so one 4 MiB P2P message lists 64 GiB of parameters."""

Chunk = tuple[int, int, int]
"""(tensor index, first byte, end byte) inside one parameter's bytes."""


# ------------------------------------------------------------------------------------- pure helpers
def byte_views(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Flat uint8 views sharing storage with each (contiguous) tensor: writes go into the parameters."""
    views = []
    for i, t in enumerate(tensors):
        if not t.is_contiguous():
            raise VolunteerError(f"parameter {i} is not contiguous; cannot sync it in place")
        views.append(t.detach().view(-1).view(torch.uint8))
    return views


def chunk_layout(views: Sequence[torch.Tensor], chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """Every tensor cut into chunks of at most `chunk_bytes` (empty tensors have none)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes: must be >= 1 (got {chunk_bytes})")
    layout = []
    for i, v in enumerate(views):
        n = v.numel()
        layout.extend((i, start, min(start + chunk_bytes, n)) for start in range(0, n, chunk_bytes))
    return layout


def chunk_bytes_of(views: Sequence[torch.Tensor], chunk: Chunk) -> bytes:
    i, start, end = chunk
    return views[i][start:end].cpu().numpy().tobytes()


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def chunk_digests(views: Sequence[torch.Tensor], layout: Sequence[Chunk]) -> list[bytes]:
    return [digest(chunk_bytes_of(views, c)) for c in layout]


def differing(mine: Sequence[bytes], theirs: Sequence[bytes]) -> list[int]:
    """Indices of chunks whose digests differ; the layouts must match (same model, same dtype)."""
    if len(mine) != len(theirs):
        raise VolunteerError(
            f"parameter layouts differ: {len(mine)} chunks here, {len(theirs)} at the leader "
            "(different model or dtype?)"
        )
    return [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]


def write_chunk(views: Sequence[torch.Tensor], chunk: Chunk, data: bytes, expected: bytes) -> None:
    """Copy the leader's bytes into place after checking length and digest."""
    i, start, end = chunk
    if len(data) != end - start:
        raise VolunteerError(f"chunk {chunk}: {len(data)} bytes received, {end - start} expected")
    if digest(data) != expected:
        raise VolunteerError(f"chunk {chunk}: digest mismatch (corrupted in transit?)")
    with torch.no_grad():
        views[i][start:end].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def pack_digests(epoch: int, chunk_bytes: int, digests: Sequence[bytes]) -> bytes:
    header = json.dumps({"epoch": epoch, "chunk_bytes": chunk_bytes, "chunks": len(digests)}).encode()
    return header + b"\n" + b"".join(digests)


def unpack_digests(blob: bytes) -> tuple[int, int, list[bytes]]:
    """(epoch, chunk_bytes, digests) from `pack_digests`; VolunteerError on a malformed reply."""
    header, sep, body = blob.partition(b"\n")
    try:
        meta = json.loads(header)
        epoch, size, n = int(meta["epoch"]), int(meta["chunk_bytes"]), int(meta["chunks"])
    except (ValueError, KeyError, TypeError) as exc:
        raise VolunteerError(f"malformed digest reply: {exc}") from None
    if not sep or len(body) != n * DIGEST_SIZE:
        raise VolunteerError(f"malformed digest reply: {len(body)} bytes for {n} digests")
    return epoch, size, [body[k * DIGEST_SIZE : (k + 1) * DIGEST_SIZE] for k in range(n)]


@dataclass(frozen=True)
class SyncResult:
    leader: str
    chunks: int
    fetched: int
    bytes_fetched: int


# --------------------------------------------------------------------------------------------- P2P
class ParameterSync:
    """The three handlers plus the leader / follower halves of one step's reconciliation.

    The main (training) thread calls `lead` or `follow`; the handlers run on `loop`, the event loop
    that owns `p2p`. `tensors` are the model's parameters, in the same order on every learner.
    """

    def __init__(
        self,
        p2p,
        loop: asyncio.AbstractEventLoop,
        me: str,
        tensors: Sequence[torch.Tensor],
        *,
        chunk_bytes: int = CHUNK_BYTES,
        timeout_s: float = 120.0,
    ) -> None:
        self.p2p, self.loop, self.me = p2p, loop, me
        self.views = byte_views(tensors)
        self.layout = chunk_layout(self.views, chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self._lock = threading.Condition()
        self._epoch = -1
        self._members: frozenset[str] = frozenset()
        self._digests: list[bytes] = []
        self._synced: set[str] = set()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s + 10)

    def register(self) -> None:
        async def add() -> None:
            await self.p2p.add_protobuf_handler(DIGESTS, self._serve_digests, wrappers_pb2.StringValue)
            await self.p2p.add_protobuf_handler(
                CHUNKS, self._serve_chunks, wrappers_pb2.StringValue, stream_output=True
            )
            await self.p2p.add_protobuf_handler(SYNCED, self._serve_synced, wrappers_pb2.StringValue)

        self._run(add())

    # ---------------------------------------------------------------------------------- leader side
    def lead(self, epoch: int, members: Sequence[str]) -> None:
        """Serve this step's parameters to `members` and block until every follower confirmed."""
        followers = frozenset(members) - {self.me}
        digests = chunk_digests(self.views, self.layout)
        with self._lock:
            self._epoch, self._members, self._digests = epoch, frozenset(members), digests
            self._synced = set()
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: followers <= self._synced, timeout=self.timeout_s):
                missing = sorted(followers - self._synced)
                raise VolunteerError(
                    f"step {epoch}: followers {missing} did not confirm the parameter sync in "
                    f"{self.timeout_s:g}s"
                )

    async def _published(self, request: wrappers_pb2.StringValue, context) -> tuple[str, int, dict]:
        """(caller, epoch, request) once this peer leads that epoch; raises for anyone outside its group."""
        caller = context.remote_id.to_base58()
        body = json.loads(request.value)
        epoch = int(body["epoch"])
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._lock:
                if self._epoch == epoch:
                    if caller not in self._members or caller == self.me:
                        raise PermissionError(f"peer {caller} is not a follower in step {epoch}'s group")
                    return caller, epoch, body
                if self._epoch > epoch:
                    raise LookupError(f"step {epoch} is over (this learner leads step {self._epoch})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"this learner never led step {epoch}")
            await asyncio.sleep(0.05)

    async def _serve_digests(self, request: wrappers_pb2.StringValue, context) -> wrappers_pb2.BytesValue:
        _, epoch, _ = await self._published(request, context)
        with self._lock:
            return wrappers_pb2.BytesValue(value=pack_digests(epoch, self.chunk_bytes, self._digests))

    async def _serve_chunks(
        self, request: wrappers_pb2.StringValue, context
    ) -> AsyncIterator[wrappers_pb2.BytesValue]:
        _, _, body = await self._published(request, context)
        for k in body["indices"]:
            if not 0 <= int(k) < len(self.layout):
                raise IndexError(f"chunk {k} out of range ({len(self.layout)} chunks)")
            yield wrappers_pb2.BytesValue(value=chunk_bytes_of(self.views, self.layout[int(k)]))

    async def _serve_synced(self, request: wrappers_pb2.StringValue, context) -> wrappers_pb2.StringValue:
        caller, _, _ = await self._published(request, context)
        with self._lock:
            self._synced.add(caller)
            self._lock.notify_all()
        return wrappers_pb2.StringValue(value="ok")

    # -------------------------------------------------------------------------------- follower side
    async def _follow(self, leader: str, epoch: int) -> SyncResult:
        from decentralized_verl.transport.p2p import peer

        ask = wrappers_pb2.StringValue(value=json.dumps({"epoch": epoch}))
        reply = await self.p2p.call_protobuf_handler(peer(leader), DIGESTS, ask, wrappers_pb2.BytesValue)
        got_epoch, size, theirs = unpack_digests(reply.value)
        if got_epoch != epoch or size != self.chunk_bytes:
            raise VolunteerError(f"leader answered for step {got_epoch} with {size}-byte chunks")
        todo = differing(chunk_digests(self.views, self.layout), theirs)
        fetched = 0
        if todo:
            request = wrappers_pb2.StringValue(value=json.dumps({"epoch": epoch, "indices": todo}))
            stream = await self.p2p.iterate_protobuf_handler(
                peer(leader), CHUNKS, request, wrappers_pb2.BytesValue
            )
            received = 0
            async for msg in stream:
                if received >= len(todo):
                    raise VolunteerError("leader sent more chunks than asked for")
                k = todo[received]
                write_chunk(self.views, self.layout[k], msg.value, theirs[k])
                fetched += len(msg.value)
                received += 1
            if received != len(todo):
                raise VolunteerError(f"leader sent {received} of {len(todo)} chunks")
        await self.p2p.call_protobuf_handler(peer(leader), SYNCED, ask, wrappers_pb2.StringValue)
        return SyncResult(leader, len(self.layout), len(todo), fetched)

    def follow(self, leader: str, epoch: int) -> SyncResult:
        """Make this learner's parameters byte-identical to `leader`'s for step `epoch`."""
        try:
            return self._run(asyncio.wait_for(self._follow(leader, epoch), self.timeout_s))
        except VolunteerError:
            raise
        except Exception as exc:  # the leader vanished or refused: never continue with diverged weights
            raise VolunteerError(
                f"step {epoch}: parameter sync with leader {leader} failed: {type(exc).__name__}: {exc}"
            ) from None

    def sync(self, epoch: int, members: Sequence[str], reachable: Sequence[str] = ()) -> SyncResult:
        """Lead or follow, whichever this peer is in the group. The leader is the smallest peer id among
        the members others can open streams to (`reachable`; all members when none is named)."""
        leader = min(reachable or members)
        if leader == self.me:
            self.lead(epoch, members)
            return SyncResult(leader, len(self.layout), 0, 0)
        return self.follow(leader, epoch)
