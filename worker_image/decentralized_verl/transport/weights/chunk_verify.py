"""Checking received chunks on a small thread pool, so a relay forwards nothing unverified yet never
waits on one hash at a time.

Every way a version reaches a relay (a gRPC Push, a Fetch while catching up, the bulk plane) checks each
chunk against the signed manifest before the chunk is forwarded or kept. ``hashlib`` releases the GIL, so
hashing a few chunks at once on spare cores keeps up with a fast link where one hashing stream would not;
the pool is shared by all of them so a node never hashes on more threads than it was given.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport.weights.codec import WeightChunk
from decentralized_verl.transport.weights.publish import Published
from decentralized_verl.transport.weights.receive import BundleBuilder


class ChunkVerifier:
    """The relay's hashing threads: ``threads`` chunks are checked at once, in arrival order."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"verify_threads: must be >= 1 (got {threads})")
        self.depth = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="relay-verify")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn`` on a hashing thread (the bulk plane checks its buffer's chunks this way)."""
        return self._pool.submit(fn, *args)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await ``fn`` on a hashing thread, so the event loop keeps serving streams meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def finish(self, builder: BundleBuilder) -> Published:
        """The whole-bundle check (`BundleBuilder.finish`) off the event loop."""
        return await self.run(builder.finish)

    async def verified(
        self, builder: BundleBuilder, messages: AsyncIterator[tuple[bytes, pb.WeightChunk]]
    ) -> AsyncIterator[tuple[bytes, WeightChunk]]:
        """Each message once ``builder`` has verified it, in arrival order.

        Up to ``depth`` chunks are hashed at once; nothing is yielded (forwarded, kept) before its own
        check passed. On an error every chunk still being hashed is waited for, so the builder is settled
        when the caller resumes from ``builder.missing``.
        """
        loop = asyncio.get_running_loop()
        pending: deque[tuple[bytes, asyncio.Future]] = deque()
        try:
            async for raw, msg in messages:
                pending.append((raw, loop.run_in_executor(self._pool, builder.add, msg)))
                while len(pending) >= self.depth or (pending and pending[0][1].done()):
                    raw, done = pending.popleft()
                    yield raw, await done
            while pending:
                raw, done = pending.popleft()
                yield raw, await done
        finally:
            if pending:
                await asyncio.wait([f for _, f in pending])

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
