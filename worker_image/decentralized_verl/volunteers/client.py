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
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.roles.interfaces import Sampling, WorkerFailure, WorkItem
from decentralized_verl.roles.samples import Prompt, Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers import p2p as wire

log = logging.getLogger(__name__)

FailureHook = Callable[[str, str, bool], None]
"""(peer_id, reason, dishonest): discovery drops or blocks the peer."""


def _request(items: Sequence[WorkItem], sampling: Sampling, version: int) -> m.GenerateBatch:
    return m.GenerateBatch(
        request_id=uuid.uuid4().hex,
        policy_version=version,
        sampling=m.SamplingParams(
            max_new_tokens=sampling.max_new_tokens,
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k),
            stop=tuple(sampling.stop),
            n=1,
            seed=sampling.seed,
        ),
        items=tuple(m.GenerateItem(p.prompt_id, i, tuple(p.token_ids)) for p, i in items),
    )


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
        samples: dict[tuple[str, int], Sample] = {}
        stream = await self.p2p.iterate_protobuf_handler(
            wire.peer(self.peer_id), wire.GENERATE, m.generate_request_to_proto(request), pb.GenerateResult
        )
        index = 0
        async for msg in stream:
            path = f"results[{index}]"
            try:
                c = m.completion_from_proto(msg, limits=self.limits, request=request, path=path)
            except WireError as exc:
                raise self._fail(f"bad result: {exc}", dishonest=True) from None
            if c.key in samples:
                raise self._fail(f"bad result: {path}: sample {c.key} answered twice", dishonest=True)
            samples[c.key] = Sample(
                prompt=prompts[c.key],
                sample_index=c.sample_index,
                response_ids=c.response_token_ids,
                logprobs=c.logprobs,
                finish_reason=c.finish_reason,
                text=c.text,
                policy_version=c.policy_version,
                worker_id=self.worker_id,
                extra={"generation_seconds": c.generation_seconds},
            )
            index += 1
        missing = [k for k in request.expected_keys() if k not in samples]
        if missing:
            raise self._fail(f"stream ended with {len(missing)} samples unanswered")
        return [samples[k] for k in request.expected_keys()]

    async def generate(
        self, items: Sequence[WorkItem], sampling: Sampling, version: int
    ) -> AsyncIterator[Sample]:
        if not items:
            return
        request = _request(items, sampling, version)
        prompts = {(p.prompt_id, i): p for p, i in items}
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
