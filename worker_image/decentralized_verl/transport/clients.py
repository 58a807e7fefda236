"""The coordinator's clients of the worker roles, one per role, over either carrier (gRPC or P2P).

Each client builds its role's request and validates the reply against it (`transport.messages`) before
anything becomes a Sample or a number the learner trusts: a wrong policy version, NaN, misaligned
lengths, an unrequested or duplicate sample, or a request left partly unanswered raises
`WorkerFailure(worker_id, reason)`, as does a call that failed in transit. The coordinator then
re-dispatches or retries. An in-cluster worker and a volunteer are held to exactly the same rules
because the same client code talks to both; only the `Carrier` differs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from decentralized_verl.core.interfaces import WorkerFailure, WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure
from decentralized_verl.transport.carriers import (
    GENERATE,
    INFO,
    LOGPROBS,
    READY,
    SCORE,
    TRAIN,
    VALUES,
    Carrier,
    CarrierError,
    GrpcCarrier,
    Method,
    P2PCarrier,
)
from decentralized_verl.transport.rollout_stream import BadResult, ResultStream, generate_request
from decentralized_verl.transport.rpc_errors import rpc_reason


class ContractBreach(WorkerFailure):
    """The worker answered, but out of contract (a result no honest worker sends)."""


def sequence_pairs(samples: Sequence[Sample]) -> tuple[m.SequencePair, ...]:
    return tuple(m.SequencePair(tuple(s.prompt.token_ids), tuple(s.response_ids)) for s in samples)


class RemoteClient:
    """A role client over a carrier; `worker_id` names the worker in every failure."""

    def __init__(self, carrier: Carrier, *, deadline_s: float = 600.0) -> None:
        self.carrier = carrier
        self.worker_id = carrier.worker_id
        self.deadline_s = deadline_s

    async def _call(self, method: Method, request: Any, reply_type: type) -> Any:
        try:
            return await self.carrier.unary(method, request, reply_type, self.deadline_s)
        except CarrierError as exc:
            raise WorkerFailure(self.worker_id, f"{method.name}: {exc.reason}") from None

    def _bad_reply(self, method: Method, exc: WireError) -> WorkerFailure:
        return ContractBreach(self.worker_id, f"{method.name}: {exc}")

    async def close(self) -> None:
        await self.carrier.close()


class RemoteRolloutClient(RemoteClient):
    """`RolloutClient`: results are checked one by one as they stream in (`ResultStream`).

    `limits` is what a result may contain (vocabulary size, ...); `max_staleness` lets results carry a
    version up to that many below the requested one; `allow_newer` accepts versions published after the
    request (async RL).
    """

    def __init__(
        self,
        carrier: Carrier,
        *,
        deadline_s: float = 600.0,
        limits: m.WireLimits | None = None,
        max_staleness: int = 0,
        allow_newer: bool = False,
    ) -> None:
        super().__init__(carrier, deadline_s=deadline_s)
        self.limits = limits or m.WireLimits()
        self.max_staleness = max_staleness
        self.allow_newer = allow_newer

    async def generate(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> AsyncIterator[Sample]:
        if not items:
            return
        request, prompts = generate_request(items, sampling, version)
        stream = ResultStream(
            request,
            prompts,
            self.worker_id,
            self.limits,
            expected_version=version,
            max_staleness=self.max_staleness,
            allow_newer=self.allow_newer,
        )
        replies = self.carrier.stream(
            GENERATE, m.generate_request_to_proto(request), pb.GenerateResult, self.deadline_s
        )
        try:
            async for msg in replies:
                try:
                    sample = stream.accept(msg)
                except BadResult as exc:
                    raise ContractBreach(self.worker_id, str(exc)) from None
                yield sample
        except CarrierError as exc:
            raise WorkerFailure(self.worker_id, f"{GENERATE.name}: {exc.reason}") from None
        finally:
            await replies.aclose()
        try:
            stream.check_complete()
        except BadResult as exc:  # a dropped stream is not proof of dishonesty
            raise WorkerFailure(self.worker_id, str(exc)) from None

    async def info(self) -> m.WorkerInfo:
        try:
            reply = await self.carrier.unary(
                INFO, pb.InfoRequest(), pb.WorkerInfo, min(self.deadline_s, 30.0)
            )
        except CarrierError as exc:
            raise WorkerFailure(self.worker_id, f"{INFO.name}: {exc.reason}") from None
        try:
            return m.worker_info_from_proto(reply)
        except WireError as exc:
            raise self._bad_reply(INFO, exc) from None


class RemoteRewardClient(RemoteClient):
    """`RewardClient`: one (score, reason) per sample, each checked finite."""

    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        items = [m.ScoreItem.of(s, reward_type) for s in samples]
        reply = await self._call(SCORE, m.score_request_to_proto(items), pb.ScoreResponse)
        try:
            return [(s.score, s.reason) for s in m.scores_from_proto(reply, len(items))]
        except WireError as exc:
            raise self._bad_reply(SCORE, exc) from None


class RemoteReferenceClient(RemoteClient):
    """`ReferenceClient`: log-probs checked finite, <= 0 and aligned with each response."""

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(sequence_pairs(samples))
        reply = await self._call(LOGPROBS, m.sequence_batch_to_proto(request), pb.TokenValuesBatch)
        try:
            return list(m.token_values_from_proto(reply, request, logprobs=True).values)
        except WireError as exc:
            raise self._bad_reply(LOGPROBS, exc) from None


class RemoteCriticClient(RemoteClient):
    """`CriticClient`: values aligned with each response; an update's loss must be finite."""

    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(sequence_pairs(samples))
        reply = await self._call(VALUES, m.sequence_batch_to_proto(request), pb.TokenValuesBatch)
        try:
            return list(m.token_values_from_proto(reply, request, logprobs=False).values)
        except WireError as exc:
            raise self._bad_reply(VALUES, exc) from None

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        items = [
            m.CriticTrainItem(pair, tuple(map(float, r)), tuple(map(float, v)))
            for pair, r, v in zip(sequence_pairs(samples), returns, old_values, strict=True)
        ]
        request = m.critic_train_request_to_proto(items, policy_version)
        reply = await self._call(TRAIN, request, pb.CriticTrainReply)
        if not math.isfinite(reply.loss):
            raise ContractBreach(self.worker_id, f"{TRAIN.name}: loss is not finite ({reply.loss})")
        return float(reply.loss)


# ------------------------------------------------------------------- the same clients, by transport
class _HealthProbe:
    """In-cluster workers answer Health: dispatch holds a failed one out until it says ready again."""

    carrier: Carrier

    async def ready(self, timeout: float) -> bool:
        reply = await self.carrier.unary(READY, pb.ReadyRequest(), pb.ReadyReply, timeout)
        return m.readiness_from_proto(reply).ready


class GrpcRolloutClient(_HealthProbe, RemoteRolloutClient):
    def __init__(self, address: str, worker_id: str | None = None, **options: Any) -> None:
        super().__init__(GrpcCarrier(address, worker_id), **options)
        self.address = address


class GrpcRewardClient(_HealthProbe, RemoteRewardClient):
    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(GrpcCarrier(address, worker_id), deadline_s=deadline_s)
        self.address = address


class GrpcReferenceClient(_HealthProbe, RemoteReferenceClient):
    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(GrpcCarrier(address, worker_id), deadline_s=deadline_s)
        self.address = address


class GrpcCriticClient(_HealthProbe, RemoteCriticClient):
    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(GrpcCarrier(address, worker_id), deadline_s=deadline_s)
        self.address = address


class P2PRewardClient(RemoteRewardClient):
    def __init__(self, p2p: Any, peer_id: str, *, deadline_s: float = 300.0) -> None:
        super().__init__(P2PCarrier(p2p, peer_id, f"reward-{peer_id[-8:]}"), deadline_s=deadline_s)
        self.peer_id = peer_id


class P2PReferenceClient(RemoteReferenceClient):
    def __init__(self, p2p: Any, peer_id: str, *, deadline_s: float = 600.0) -> None:
        super().__init__(P2PCarrier(p2p, peer_id, f"reference-{peer_id[-8:]}"), deadline_s=deadline_s)
        self.peer_id = peer_id


class P2PCriticClient(RemoteCriticClient):
    def __init__(self, p2p: Any, peer_id: str, *, deadline_s: float = 600.0) -> None:
        super().__init__(P2PCarrier(p2p, peer_id, f"critic-{peer_id[-8:]}"), deadline_s=deadline_s)
        self.peer_id = peer_id


async def wait_ready(address: str, timeout: float, *, poll_s: float = 0.2) -> m.Readiness:
    """Poll Health.Ready until the worker says ready; TimeoutError (with the last reason) otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    async with secure.aio_channel(address) as channel:
        stub = pb_grpc.HealthStub(channel)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{address} not ready after {timeout:g}s ({last})")
            try:
                reply = await stub.Ready(pb.ReadyRequest(), timeout=max(0.05, min(left, 5.0)))
                readiness = m.readiness_from_proto(reply)
                if readiness.ready:
                    return readiness
                last = f"{readiness.role} {readiness.worker_id} says not ready"
            except grpc.RpcError as exc:
                last = rpc_reason(exc)
            except WireError as exc:
                last = f"bad Ready reply: {exc}"
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
