"""gRPC clients of the worker roles, implementing the coordinator's protocols (roles/interfaces.py).

Every reply is validated with messages.py against the request it answers before it becomes a Sample or
a number the learner trusts: a wrong policy version, NaN, misaligned lengths, an unrequested or duplicate
sample, or a request left partly unanswered raises `WorkerFailure(worker_id, reason)`, as does any gRPC
error (deadline, unavailable, ...). The coordinator then re-dispatches whatever was not answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.roles.interfaces import Sampling, WorkerFailure, WorkItem
from decentralized_verl.roles.samples import Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.grpc_options import channel_options
from decentralized_verl.transport.rollout_stream import BadResult, ResultStream, generate_request


def _rpc_reason(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'UNKNOWN'}: {details}"


class _GrpcClient:
    """A channel to one worker; `worker_id` names it in every WorkerFailure."""

    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        self.address = address
        self.worker_id = worker_id or address
        self.deadline_s = deadline_s
        self._channel = grpc.aio.insecure_channel(address, options=channel_options())

    def failure(self, what: str, exc: BaseException) -> WorkerFailure:
        reason = _rpc_reason(exc) if isinstance(exc, grpc.RpcError) else str(exc)
        return WorkerFailure(self.worker_id, f"{what}: {reason}")

    async def close(self) -> None:
        await self._channel.close()


def _pairs(samples: Sequence[Sample]) -> tuple[m.SequencePair, ...]:
    return tuple(m.SequencePair(tuple(s.prompt.token_ids), tuple(s.response_ids)) for s in samples)


class GrpcRolloutClient(_GrpcClient):
    """`RolloutClient` over the Rollout service.

    `limits` is what a result may contain (vocabulary size, ...); `max_staleness` lets results carry a
    version up to that many below the requested one (0: exactly the requested version).
    """

    def __init__(
        self,
        address: str,
        worker_id: str | None = None,
        *,
        deadline_s: float = 600.0,
        limits: m.WireLimits | None = None,
        max_staleness: int = 0,
        allow_newer: bool = False,
    ) -> None:
        super().__init__(address, worker_id, deadline_s=deadline_s)
        self._stub = pb_grpc.RolloutStub(self._channel)
        self.limits = limits or m.WireLimits()
        self.max_staleness = max_staleness
        self.allow_newer = allow_newer

    async def generate(
        self, items: Sequence[WorkItem], sampling: Sampling, version: int
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
        call = self._stub.Generate(m.generate_request_to_proto(request), timeout=self.deadline_s)
        try:
            async for msg in call:
                try:
                    sample = stream.accept(msg)
                except BadResult as exc:
                    raise WorkerFailure(self.worker_id, str(exc)) from None
                yield sample
            stream.check_complete()
        except BadResult as exc:
            raise WorkerFailure(self.worker_id, str(exc)) from None
        except grpc.RpcError as exc:
            raise self.failure("Generate", exc) from None
        finally:
            call.cancel()  # no-op when the stream ended; stops the worker when the caller gave up early

    async def info(self) -> m.WorkerInfo:
        try:
            msg = await self._stub.Info(pb.InfoRequest(), timeout=min(self.deadline_s, 30.0))
            return m.worker_info_from_proto(msg)
        except (grpc.RpcError, WireError) as exc:
            raise self.failure("Info", exc) from None


class GrpcReferenceClient(_GrpcClient):
    """`ReferenceClient` over the Reference service; log-probs checked finite, <= 0 and aligned."""

    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(address, worker_id, deadline_s=deadline_s)
        self._stub = pb_grpc.ReferenceStub(self._channel)

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(_pairs(samples))
        try:
            reply = await self._stub.LogProbs(m.sequence_batch_to_proto(request), timeout=self.deadline_s)
            return list(m.token_values_from_proto(reply, request, logprobs=True).values)
        except (grpc.RpcError, WireError) as exc:
            raise self.failure("LogProbs", exc) from None


class GrpcCriticClient(_GrpcClient):
    """`CriticClient` over the Critic service."""

    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(address, worker_id, deadline_s=deadline_s)
        self._stub = pb_grpc.CriticStub(self._channel)

    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(_pairs(samples))
        try:
            reply = await self._stub.Values(m.sequence_batch_to_proto(request), timeout=self.deadline_s)
            return list(m.token_values_from_proto(reply, request, logprobs=False).values)
        except (grpc.RpcError, WireError) as exc:
            raise self.failure("Values", exc) from None

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        items = [
            m.CriticTrainItem(pair, tuple(map(float, r)), tuple(map(float, v)))
            for pair, r, v in zip(_pairs(samples), returns, old_values, strict=True)
        ]
        try:
            reply = await self._stub.Train(
                m.critic_train_request_to_proto(items, policy_version), timeout=self.deadline_s
            )
        except grpc.RpcError as exc:
            raise self.failure("Train", exc) from None
        if reply.loss != reply.loss or reply.loss in (float("inf"), float("-inf")):
            raise WorkerFailure(self.worker_id, f"Train: loss is not finite ({reply.loss})")
        return float(reply.loss)


class GrpcRewardClient(_GrpcClient):
    """`RewardClient` over the Reward service."""

    def __init__(self, address: str, worker_id: str | None = None, *, deadline_s: float = 600.0) -> None:
        super().__init__(address, worker_id, deadline_s=deadline_s)
        self._stub = pb_grpc.RewardStub(self._channel)

    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        items = [m.ScoreItem(s.prompt.text, s.text, s.prompt.ground_truth, reward_type) for s in samples]
        try:
            reply = await self._stub.Score(m.score_request_to_proto(items), timeout=self.deadline_s)
            return [(s.score, s.reason) for s in m.scores_from_proto(reply, len(items))]
        except (grpc.RpcError, WireError) as exc:
            raise self.failure("Score", exc) from None


async def wait_ready(address: str, timeout: float, *, poll_s: float = 0.2) -> m.Readiness:
    """Poll Health.Ready until the worker says ready; TimeoutError (with the last reason) otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
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
                last = _rpc_reason(exc)
            except WireError as exc:
                last = f"bad Ready reply: {exc}"
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
