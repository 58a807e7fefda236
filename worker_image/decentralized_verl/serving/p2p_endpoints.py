"""The serving roles' face over Hivemind P2P: a volunteer registers stream handlers a coordinator calls.

Same messages and validation as the gRPC servicers (servicers.py), same work (handlers.py); what is
P2P's own is who may call. libp2p's secure channel authenticates the caller's peer id: a token-checked
volunteer serves only the coordinator named in its token; `coordinator=None` is the open quick-start mode
(trusted networks), where any caller may use the role. Each endpoint counts what it served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.rewards.servable import servable_reward
from decentralized_verl.serving import handlers
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.carriers import GENERATE, LOGPROBS, SCORE, TRAIN, VALUES
from decentralized_verl.transport.p2p import Unauthorized

log = logging.getLogger(__name__)


class _Endpoint:
    def __init__(
        self, p2p: Any, worker: Any, *, coordinator: str | None, limits: m.WireLimits | None
    ) -> None:
        self.p2p = p2p
        self.worker = worker
        self.coordinator = coordinator
        self.limits = limits or m.WireLimits()

    def _authorize(self, context: Any, what: str) -> str:
        caller = context.remote_id.to_base58()
        if self.coordinator is not None and caller != self.coordinator:
            raise Unauthorized(f"only the job's coordinator may {what} (not {caller})")
        return caller


class RolloutEndpoint(_Endpoint):
    """Generate, for the job's coordinator (or, open mode, any caller)."""

    def __init__(
        self,
        p2p: Any,
        worker: Any,
        *,
        coordinator: str | None,
        limits: m.WireLimits | None = None,
        on_caller: Callable[[str], Any] | None = None,
    ) -> None:
        """`on_caller(peer_id)` (awaited when it returns a coroutine) runs before the work, e.g. so an open
        actor follows that caller's weights."""
        super().__init__(p2p, worker, coordinator=coordinator, limits=limits)
        self.on_caller = on_caller
        self.requests = 0
        self.samples = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(
            GENERATE.p2p_name, self._generate, pb.GenerateRequest, stream_output=True
        )

    async def _generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateResult]:
        caller = self._authorize(context, "request work")
        batch = m.generate_request_from_proto(request, self.limits)
        if self.on_caller is not None:
            result = self.on_caller(caller)
            if asyncio.iscoroutine(result):
                await result
        self.requests += 1
        log.info(
            "request %s: %d items at policy v%d",
            batch.request_id,
            len(batch.items) * batch.sampling.n,
            batch.policy_version,
        )
        async for completion in handlers.completions(self.worker, batch):
            self.samples += 1
            yield m.completion_to_proto(completion)


class CriticEndpoint(_Endpoint):
    """Values and Train around a `serving.scoring.CriticWorker`."""

    def __init__(
        self, p2p: Any, worker: Any, *, coordinator: str | None, limits: m.WireLimits | None = None
    ) -> None:
        super().__init__(p2p, worker, coordinator=coordinator, limits=limits)
        self.values_requests = 0
        self.train_steps = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(VALUES.p2p_name, self._values, pb.SequenceBatch)
        await self.p2p.add_protobuf_handler(TRAIN.p2p_name, self._train, pb.CriticTrainRequest)

    async def _values(self, request: pb.SequenceBatch, context: Any) -> pb.TokenValuesBatch:
        self._authorize(context, "use this critic")
        batch = m.sequence_batch_from_proto(request, self.limits)
        reply = await handlers.token_values(self.worker.values, batch, self.worker.worker_id)
        self.values_requests += 1
        return reply

    async def _train(self, request: pb.CriticTrainRequest, context: Any) -> pb.CriticTrainReply:
        self._authorize(context, "use this critic")
        items, version = m.critic_train_request_from_proto(request, self.limits)
        reply = await handlers.critic_update(self.worker, items, version)
        self.train_steps += 1
        return reply


class ReferenceEndpoint(_Endpoint):
    """LogProbs around a `serving.scoring.ReferenceWorker`; serves any caller (open mode)."""

    def __init__(self, p2p: Any, worker: Any, *, limits: m.WireLimits | None = None) -> None:
        super().__init__(p2p, worker, coordinator=None, limits=limits)
        self.requests = 0
        self.sequences = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(LOGPROBS.p2p_name, self._logprobs, pb.SequenceBatch)

    async def _logprobs(self, request: pb.SequenceBatch, context: Any) -> pb.TokenValuesBatch:
        batch = m.sequence_batch_from_proto(request, self.limits)
        reply = await handlers.token_values(self.worker.logprobs, batch, self.worker.worker_id)
        self.requests += 1
        self.sequences += len(batch.items)
        return reply


class RewardEndpoint(_Endpoint):
    """Score around a `serving.scoring.RewardWorker`; serves any caller (open mode), but runs only rewards
    shipped with the package (`rewards.servable`)."""

    def __init__(
        self, p2p: Any, worker: Any, *, has_reward_model: bool, limits: m.WireLimits | None = None
    ) -> None:
        super().__init__(p2p, worker, coordinator=None, limits=limits)
        self.has_reward_model = has_reward_model
        self.requests = 0
        self.items = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(SCORE.p2p_name, self._score, pb.ScoreRequest)

    async def _score(self, request: pb.ScoreRequest, context: Any) -> pb.ScoreResponse:
        items = m.score_request_from_proto(request, self.limits)
        for kind in sorted({it.reward_type for it in items}):
            refused = servable_reward(kind, has_reward_model=self.has_reward_model)
            if refused:
                raise PermissionError(refused)
        reply = await handlers.scores(self.worker, items)
        self.requests += 1
        self.items += len(items)
        return reply
