"""What the coordinator calls, whoever serves it: a gRPC worker, a volunteer over P2P, or the learner itself.

One interface per role. Colocated roles (replicas 0) implement the same protocol in-process, so the
coordinator's loop has one code path. Every method is async; implementations run torch work in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.core.sampling import SamplingParams

WorkItem = tuple[Prompt, int]
"""A prompt and the sample index to generate for it; each item is answered exactly once."""


class WorkerFailure(Exception):
    """A worker failed or returned garbage; the unanswered items go back to the queue."""

    def __init__(self, worker_id: str, reason: str) -> None:
        self.worker_id = worker_id
        self.reason = reason
        super().__init__(f"{worker_id}: {reason}")


def closed_under_us() -> bool:
    """Whether a CancelledError came from the call's own channel being closed (a worker removed from
    dispatch mid-call) rather than from cancelling the task that waits on it: only the latter may travel
    up as a cancellation; the former is that worker's failure."""
    task = asyncio.current_task()
    return task is None or not task.cancelling()


@runtime_checkable
class RolloutClient(Protocol):
    worker_id: str

    def generate(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> AsyncIterator[Sample]:
        """Yield one Sample per item as it finishes (any order), generated with policy `version`.

        The worker fetches that version's weights first if it holds an older one. Raises WorkerFailure
        (possibly after yielding some samples) when the worker breaks or answers out of contract.
        """
        ...

    async def close(self) -> None: ...


@runtime_checkable
class RewardClient(Protocol):
    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        """(score, reason) per sample, same order; never raises for a bad completion (score 0)."""
        ...


@runtime_checkable
class ReferenceClient(Protocol):
    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Reference-model log-probs of each sample's response tokens (same temperature as training)."""
        ...


@runtime_checkable
class CriticClient(Protocol):
    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Per-response-token values V(s_t), one per response token."""
        ...

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        """One critic update (value loss with clipping); returns the mean loss."""
        ...
