"""The gRPC face of each role: validate the request (messages.py), do the work (handlers.py), answer.

A request that breaks the contract is answered INVALID_ARGUMENT with the field path from `WireError`;
a worker that cannot serve (weights unavailable, a model error) answers UNAVAILABLE / INTERNAL with the
reason, so the coordinator logs it and re-dispatches. `serve` starts one server for any servicers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.runtime import device
from decentralized_verl.serving import handlers
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.scoring import CriticWorker, ReferenceWorker, RewardWorker
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure

log = logging.getLogger(__name__)


async def _invalid(context: grpc.aio.ServicerContext, exc: WireError) -> None:
    log.warning("rejected request: %s", exc)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


async def _failed(context: grpc.aio.ServicerContext, what: str, exc: BaseException) -> None:
    log.exception("%s failed", what)
    code = grpc.StatusCode.UNAVAILABLE if isinstance(exc, WireError) else grpc.StatusCode.INTERNAL
    await context.abort(code, f"{what} failed: {type(exc).__name__}: {exc}"[:2000])


class RolloutServicer(pb_grpc.RolloutServicer):
    """Generate: one GenerateResult per requested (prompt, sample), streamed as each micro-batch ends."""

    def __init__(self, worker: RolloutWorker, limits: m.WireLimits | None = None) -> None:
        self.worker = worker
        self.limits = limits or m.WireLimits()

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        try:
            batch = m.generate_request_from_proto(request, self.limits)
        except WireError as exc:
            await _invalid(context, exc)
        began = time.perf_counter()
        try:
            async for completion in handlers.completions(self.worker, batch):
                yield m.completion_to_proto(completion)
        except ValueError as exc:  # the backend refused a request (prompt too long for the model, ...)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # weights unavailable (WireError -> UNAVAILABLE), model errors
            await _failed(context, "generation", exc)
        log.debug("request %s answered in %.2fs", batch.request_id, time.perf_counter() - began)

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return m.worker_info_to_proto(
            m.WorkerInfo(
                worker_id=self.worker.worker_id,
                role="rollout",
                policy_version=self.worker.version,
                tokens_per_second=self.worker.tokens_per_second,
                backend=self.worker.backend_name,
            )
        )


async def _per_token(
    request: pb.SequenceBatch,
    context: grpc.aio.ServicerContext,
    limits: m.WireLimits,
    compute: Any,
    what: str,
    worker_id: str,
) -> pb.TokenValuesBatch:
    """Validate a SequenceBatch, then answer per-token numbers (`handlers.token_values`)."""
    try:
        batch = m.sequence_batch_from_proto(request, limits)
    except WireError as exc:
        await _invalid(context, exc)
    try:
        return await handlers.token_values(compute, batch, worker_id)
    except Exception as exc:
        await _failed(context, what, exc)


class ReferenceServicer(pb_grpc.ReferenceServicer):
    def __init__(self, worker: ReferenceWorker, limits: m.WireLimits | None = None) -> None:
        self.worker = worker
        self.limits = limits or m.WireLimits()

    async def LogProbs(
        self, request: pb.SequenceBatch, context: grpc.aio.ServicerContext
    ) -> pb.TokenValuesBatch:
        return await _per_token(
            request, context, self.limits, self.worker.logprobs, "reference log-probs", self.worker.worker_id
        )


class CriticServicer(pb_grpc.CriticServicer):
    def __init__(self, worker: CriticWorker, limits: m.WireLimits | None = None) -> None:
        self.worker = worker
        self.limits = limits or m.WireLimits()

    async def Values(
        self, request: pb.SequenceBatch, context: grpc.aio.ServicerContext
    ) -> pb.TokenValuesBatch:
        return await _per_token(
            request, context, self.limits, self.worker.values, "critic values", self.worker.worker_id
        )

    async def Train(
        self, request: pb.CriticTrainRequest, context: grpc.aio.ServicerContext
    ) -> pb.CriticTrainReply:
        try:
            items, policy_version = m.critic_train_request_from_proto(request, self.limits)
        except WireError as exc:
            await _invalid(context, exc)
        try:
            return await handlers.critic_update(self.worker, items, policy_version)
        except Exception as exc:
            await _failed(context, "critic update", exc)


class RewardServicer(pb_grpc.RewardServicer):
    def __init__(self, worker: RewardWorker, limits: m.WireLimits | None = None) -> None:
        self.worker = worker
        self.limits = limits or m.WireLimits()

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        try:
            items = m.score_request_from_proto(request, self.limits)
        except WireError as exc:
            await _invalid(context, exc)
        refused = self.worker.refusal(items)
        if refused is not None:
            peer = context.peer() or "an unknown peer"
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"Score from {peer}: {refused}")
        return await handlers.scores(self.worker, items)  # never raises for a bad completion


class HealthServicer(pb_grpc.HealthServicer):
    """Readiness: false until the worker's model is loaded (`set_ready()`), so launchers wait on it."""

    def __init__(self, role: str, worker_id: str, *, ready: bool = False) -> None:
        m.role_from_name(role)  # a typo in the role is a bug: fail at construction
        self.role = role
        self.worker_id = worker_id
        self.ready = ready

    def set_ready(self, ready: bool = True) -> None:
        self.ready = ready

    async def Ready(self, request: pb.ReadyRequest, context: grpc.aio.ServicerContext) -> pb.ReadyReply:
        # The worker's own device and what it holds there, read in this process (`runtime.device`).
        here = device.choice().name
        held = device.memory_allocated()
        return m.readiness_to_proto(m.Readiness(self.ready, self.role, self.worker_id, here, held))


_ADDERS = (
    (pb_grpc.RolloutServicer, pb_grpc.add_RolloutServicer_to_server),
    (pb_grpc.WeightsServicer, pb_grpc.add_WeightsServicer_to_server),
    (pb_grpc.RewardServicer, pb_grpc.add_RewardServicer_to_server),
    (pb_grpc.ReferenceServicer, pb_grpc.add_ReferenceServicer_to_server),
    (pb_grpc.CriticServicer, pb_grpc.add_CriticServicer_to_server),
    (pb_grpc.CoordinatorServicer, pb_grpc.add_CoordinatorServicer_to_server),
    (pb_grpc.VolunteerServicer, pb_grpc.add_VolunteerServicer_to_server),
    (pb_grpc.HealthServicer, pb_grpc.add_HealthServicer_to_server),
)


async def serve(
    port: int, *servicers: object, host: str = "127.0.0.1", credentials: Any = secure.PROCESS
) -> grpc.aio.Server:
    """Start a grpc.aio server on host:port with every given servicer (any generated service base).

    With port 0 the OS picks a free port; it is available as `server.port` (set here). Stop with
    `await server.stop(grace)`. `credentials` default to this process's job credentials (TLS, and the
    job token required on every call); None serves plaintext.
    """
    registering = [
        (servicer, [(base, add) for base, add in _ADDERS if isinstance(servicer, base)])
        for servicer in servicers
    ]
    for servicer, matched in registering:
        if not matched:
            raise TypeError(f"{type(servicer).__name__} is not a servicer of any dverl service")
    services = {base.__name__.removesuffix("Servicer") for _, matched in registering for base, _ in matched}
    server = secure.aio_server(credentials=credentials, services=services)
    for servicer, matched in registering:
        for _, add in matched:
            add(servicer, server)
    bound = secure.bind(server, host, port)
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.port = bound  # type: ignore[attr-defined]
    await server.start()
    return server
