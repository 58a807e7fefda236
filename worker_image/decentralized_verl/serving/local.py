"""Colocated roles: the role protocols served in-process (replicas 0), with the same workers as gRPC.

The torch work runs on the process's compute thread (`compute_thread`), so the coordinator's event loop
stays responsive and every step computes on the same thread; generation is streamed sample by sample
through an asyncio queue, as over gRPC.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TypeVar

from decentralized_verl.core.interfaces import WorkerFailure, WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.runtime import compute_thread
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.scoring import CriticWorker, ReferenceWorker, RewardWorker

T = TypeVar("T")
_DONE = object()


async def stream_in_thread(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Run a blocking iterator on the compute thread and yield its items on the event loop as they come.

    If the consumer stops early (or is cancelled) the thread is told to stop and closes the iterator
    after the item it is producing; an exception in the thread is re-raised here.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def run() -> None:
        iterator = None
        try:
            iterator = make()
            for item in iterator:
                put(item)
                if stop.is_set():
                    break
        except BaseException as exc:  # forwarded to the consumer
            put(exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            put(_DONE)

    compute_thread.submit(run)
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class LocalRolloutClient:
    """`RolloutClient` over an in-process `RolloutWorker`."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id

    async def generate(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> AsyncIterator[Sample]:
        items = list(items)
        try:
            async for sample in stream_in_thread(lambda: self.worker.generate_sync(items, sampling, version)):
                yield sample
        except WorkerFailure:
            raise
        except Exception as exc:
            raise WorkerFailure(self.worker_id, f"{type(exc).__name__}: {exc}") from exc

    @property
    def tokens_per_second(self) -> float:
        return self.worker.tokens_per_second

    async def close(self) -> None:
        return None


class LocalRewardClient:
    """`RewardClient` over an in-process `RewardWorker`."""

    def __init__(self, worker: RewardWorker) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id

    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        return await asyncio.to_thread(self.worker.score, list(samples), reward_type)

    async def close(self) -> None:
        return None


class LocalReferenceClient:
    """`ReferenceClient` over an in-process `ReferenceWorker`."""

    def __init__(self, worker: ReferenceWorker) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return await compute_thread.run(self.worker.logprobs, list(samples))

    async def close(self) -> None:
        return None


class LocalCriticClient:
    """`CriticClient` over an in-process `CriticWorker`."""

    def __init__(self, worker: CriticWorker) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id

    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return await compute_thread.run(self.worker.values, list(samples))

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        return await compute_thread.run(self.worker.train, list(samples), returns, old_values, policy_version)

    async def close(self) -> None:
        return None
