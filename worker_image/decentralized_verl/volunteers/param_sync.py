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
members), carrying the Param* messages of proto/dverl.proto; `transport.wire.param_sync` checks every
field on receipt. Only members of the current step's group may call them. A follower writes the fetched
chunks only once every one of them arrived and passed its digest check, so a refused or broken sync
leaves its parameters as they were.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import torch

from decentralized_verl.errors import VolunteerError, WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.p2p import peer

DIGESTS = "dverl.Learner/Digests"
CHUNKS = "dverl.Learner/Chunks"
SYNCED = "dverl.Learner/Synced"
CHUNK_BYTES = 1 << 18
DIGEST_SIZE = m.PARAM_DIGEST_SIZE

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


def check_chunk(chunk: Chunk, data: bytes, expected: bytes) -> None:
    """The leader's bytes for `chunk` have its length and digest."""
    _, start, end = chunk
    if len(data) != end - start:
        raise VolunteerError(f"chunk {chunk}: {len(data)} bytes received, {end - start} expected")
    if digest(data) != expected:
        raise VolunteerError(f"chunk {chunk}: digest mismatch (corrupted in transit?)")


def write_chunk(views: Sequence[torch.Tensor], chunk: Chunk, data: bytes, expected: bytes) -> None:
    """Copy the leader's bytes into place after checking length and digest."""
    check_chunk(chunk, data, expected)
    i, start, end = chunk
    with torch.no_grad():
        views[i][start:end].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def refused(what: str, peer_id: str, exc: WireError) -> VolunteerError:
    """A message that broke the contract, named with the peer that sent it."""
    return VolunteerError(f"{what} from peer {peer_id} refused: {exc}")


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
            await self.p2p.add_protobuf_handler(DIGESTS, self._serve_digests, pb.ParamDigestsRequest)
            await self.p2p.add_protobuf_handler(
                CHUNKS, self._serve_chunks, pb.ParamChunksRequest, stream_output=True
            )
            await self.p2p.add_protobuf_handler(SYNCED, self._serve_synced, pb.ParamSyncedRequest)

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

    @staticmethod
    def _caller(context) -> str:
        return context.remote_id.to_base58()

    async def _published(self, caller: str, epoch: int) -> None:
        """Returns once this peer leads `epoch`; raises for anyone outside that step's group."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._lock:
                if self._epoch == epoch:
                    if caller not in self._members or caller == self.me:
                        raise PermissionError(f"peer {caller} is not a follower in step {epoch}'s group")
                    return
                if self._epoch > epoch:
                    raise LookupError(f"step {epoch} is over (this learner leads step {self._epoch})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"this learner never led step {epoch}")
            await asyncio.sleep(0.05)

    async def _serve_digests(self, request: pb.ParamDigestsRequest, context) -> pb.ParamDigests:
        caller = self._caller(context)
        try:
            epoch = m.param_digests_request_from_proto(request)
        except WireError as exc:
            raise refused("Digests request", caller, exc) from None
        await self._published(caller, epoch)
        with self._lock:
            return m.param_digests_to_proto(epoch, self.chunk_bytes, self._digests)

    async def _serve_chunks(self, request: pb.ParamChunksRequest, context) -> AsyncIterator[pb.ParamChunk]:
        caller = self._caller(context)
        try:
            epoch, indices = m.param_chunks_request_from_proto(request, chunks=len(self.layout))
        except WireError as exc:
            raise refused("Chunks request", caller, exc) from None
        await self._published(caller, epoch)
        for k in indices:
            yield m.param_chunk_to_proto(k, chunk_bytes_of(self.views, self.layout[k]))

    async def _serve_synced(self, request: pb.ParamSyncedRequest, context) -> pb.ParamSyncedReply:
        caller = self._caller(context)
        try:
            epoch = m.param_synced_request_from_proto(request)
        except WireError as exc:
            raise refused("Synced", caller, exc) from None
        await self._published(caller, epoch)
        with self._lock:
            self._synced.add(caller)
            self._lock.notify_all()
        return m.param_synced_reply_to_proto(epoch)

    # -------------------------------------------------------------------------------- follower side
    async def _fetch(
        self, leader: str, epoch: int, todo: Sequence[int], theirs: Sequence[bytes]
    ) -> list[bytes]:
        """The leader's bytes for `todo`, each checked against its digest; nothing is written here."""
        request = m.param_chunks_request_to_proto(epoch, todo)
        stream = await self.p2p.iterate_protobuf_handler(peer(leader), CHUNKS, request, pb.ParamChunk)
        received: list[bytes] = []
        async for msg in stream:
            if len(received) >= len(todo):
                raise VolunteerError(f"leader {leader} sent more chunks than the {len(todo)} asked for")
            k = todo[len(received)]
            start, end = self.layout[k][1:]
            try:
                data = m.param_chunk_from_proto(msg, index=k, size=end - start)
            except WireError as exc:
                raise refused("Chunk", leader, exc) from None
            check_chunk(self.layout[k], data, theirs[k])
            received.append(data)
        if len(received) != len(todo):
            raise VolunteerError(f"leader {leader} sent {len(received)} of {len(todo)} chunks")
        return received

    async def _follow(self, leader: str, epoch: int) -> SyncResult:
        ask = m.param_digests_request_to_proto(epoch)
        reply = await self.p2p.call_protobuf_handler(peer(leader), DIGESTS, ask, pb.ParamDigests)
        try:
            theirs = m.param_digests_from_proto(
                reply, epoch=epoch, chunk_bytes=self.chunk_bytes, chunks=len(self.layout)
            )
        except WireError as exc:
            raise refused("Digests", leader, exc) from None
        todo = differing(chunk_digests(self.views, self.layout), theirs)
        received = await self._fetch(leader, epoch, todo, theirs) if todo else []
        for k, data in zip(todo, received, strict=True):  # every chunk checked: now write them all
            write_chunk(self.views, self.layout[k], data, theirs[k])
        confirm = m.param_synced_request_to_proto(epoch)
        ack = await self.p2p.call_protobuf_handler(peer(leader), SYNCED, confirm, pb.ParamSyncedReply)
        try:
            m.param_synced_reply_from_proto(ack, epoch=epoch)
        except WireError as exc:
            raise refused("Synced reply", leader, exc) from None
        return SyncResult(leader, len(self.layout), len(todo), sum(len(d) for d in received))

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
