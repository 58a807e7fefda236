"""`VolunteerRolloutClient`: the coordinator's `RolloutClient` for one volunteer, over P2P.

The same client as for an in-cluster worker (`transport.clients.RemoteRolloutClient` over a
`P2PCarrier`: every result validated against the request), plus what an untrusted peer needs: the
batch is held back until it is complete and a sampled fraction passed re-verification (verify.py), so a
dishonest batch is dropped whole and re-dispatched; a deadline bounds the whole request, so a volunteer
that vanishes mid-task costs at most that long. Every failure is reported to discovery, which drops the
peer (it vanished) or blocks it (it lied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from decentralized_verl.core.interfaces import WorkerFailure, WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.carriers import P2PCarrier
from decentralized_verl.transport.clients import ContractBreach, RemoteRolloutClient

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
        self.peer_id = peer_id
        self.worker_id = worker_id or f"volunteer-{peer_id[-8:]}"
        self.remote = RemoteRolloutClient(
            P2PCarrier(p2p, peer_id, self.worker_id), deadline_s=deadline_s, limits=limits
        )
        self.verifier = verifier
        self.on_failure = on_failure
        self.accepted = 0
        self.rejected = 0
        self.last_answer = 0.0
        """Wall time of its last complete answer: direct evidence that it is alive (discovery.py)."""

    def _fail(self, reason: str, *, dishonest: bool = False) -> WorkerFailure:
        if self.on_failure is not None:
            self.on_failure(self.peer_id, reason, dishonest)
        return WorkerFailure(self.worker_id, reason)

    async def generate(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> AsyncIterator[Sample]:
        if not items:
            return
        started = time.perf_counter()
        try:
            # A volunteer's unverified prefixes are not continued elsewhere: its late items are regenerated.
            samples = [
                s
                async for s in self.remote.generate(items, sampling, version)
                if s.finish_reason != "partial"
            ]
        except WorkerFailure as exc:
            self.rejected += len(items)
            raise self._fail(exc.reason, dishonest=isinstance(exc, ContractBreach)) from None
        if self.verifier is not None:
            result = await asyncio.to_thread(self.verifier.check, samples, version, sampling)
            if not result.ok:
                self.rejected += len(samples)
                shown = "; ".join(str(x) for x in result.mismatches[:3])
                raise self._fail(
                    f"verification failed on {len(result.mismatches)} of {result.checked} checked samples: "
                    f"{shown}",
                    dishonest=True,
                )
        self.accepted += len(samples)
        self.last_answer = time.time()
        log.debug("%s: %d samples in %.2fs", self.worker_id, len(samples), time.perf_counter() - started)
        for sample in samples:
            yield sample

    async def close(self) -> None:
        return None
