"""`VolunteerRolloutClient`: the coordinator's `RolloutClient` for one volunteer, over P2P.

Same contract as `GrpcRolloutClient`: every result is validated with `messages.completion_from_proto`
against the request (version, shapes, NaN, unrequested or duplicate samples). In addition a volunteer's
batch is held back until it is complete and a sampled fraction passed re-verification (verify.py), so a
dishonest batch is dropped whole and re-dispatched. A deadline bounds every request: a volunteer that
vanishes mid-task costs at most that long, then its items go to the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.roles.interfaces import Sampling, WorkerFailure, WorkItem
from decentralized_verl.roles.samples import Prompt, Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.rollout_stream import BadResult, ResultStream, generate_request
from decentralized_verl.volunteers import p2p as wire

log = logging.getLogger(__name__)

FailureHook = Callable[[str, str, bool], None]
"""(peer_id, reason, dishonest): discovery drops or blocks the peer."""


class VolunteerRolloutClient:
    def __init__(
        self,
        p2p,
        peer_id: str,
        *,
        worker_id: str | None = None,
        limits: m.WireLimits | None = None,
        deadline_s: float = 300.0,
        verifier=None,
        on_failure: FailureHook | None = None,
    ) -> None:
        self.p2p = p2p
        self.peer_id = peer_id
        self.worker_id = worker_id or f"volunteer-{peer_id[-8:]}"
        self.limits = limits or m.WireLimits()
        self.deadline_s = deadline_s
        self.verifier = verifier
        self.on_failure = on_failure
        self.accepted = 0
        self.rejected = 0

    def _fail(self, reason: str, *, dishonest: bool = False) -> WorkerFailure:
        if self.on_failure is not None:
            self.on_failure(self.peer_id, reason, dishonest)
        return WorkerFailure(self.worker_id, reason)

    async def _collect(
        self, request: m.GenerateBatch, prompts: dict[tuple[str, int], Prompt]
    ) -> list[Sample]:
        stream = ResultStream(request, prompts, self.worker_id, self.limits)
        results = await self.p2p.iterate_protobuf_handler(
            wire.peer(self.peer_id), wire.GENERATE, m.generate_request_to_proto(request), pb.GenerateResult
        )
        samples: list[Sample] = []
        try:
            async for msg in results:
                samples.append(stream.accept(msg))
        except BadResult as exc:
            raise self._fail(str(exc), dishonest=True) from None
        try:
            stream.check_complete()
        except BadResult as exc:
            raise self._fail(str(exc)) from None  # a dropped stream is not proof of dishonesty
        return samples

    async def generate(
        self, items: Sequence[WorkItem], sampling: Sampling, version: int
    ) -> AsyncIterator[Sample]:
        if not items:
            return
        request, prompts = generate_request(items, sampling, version)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.deadline_s):
                samples = await self._collect(request, prompts)
        except WorkerFailure:
            self.rejected += len(items)
            raise
        except TimeoutError:
            self.rejected += len(items)
            raise self._fail(f"no complete answer within the {self.deadline_s:g}s deadline") from None
        except Exception as exc:  # the peer vanished, refused the stream, or its handler failed
            self.rejected += len(items)
            raise self._fail(f"P2P stream failed: {type(exc).__name__}: {exc}") from None
        if self.verifier is not None:
            result = await asyncio.to_thread(self.verifier.check, samples, version)
            if not result.ok:
                self.rejected += len(samples)
                shown = "; ".join(str(x) for x in result.mismatches[:3])
                raise self._fail(
                    f"verification failed on {len(result.mismatches)} of {result.checked} checked samples: "
                    f"{shown}",
                    dishonest=True,
                )
        self.accepted += len(samples)
        log.debug("%s: %d samples in %.2fs", self.worker_id, len(samples), time.perf_counter() - started)
        for sample in samples:
            yield sample

    async def close(self) -> None:
        return None
