"""The critic role over Hivemind P2P: a volunteer serves values and value-model updates to a trainer.

Same messages as the in-cluster Critic gRPC service (`SequenceBatch` -> `TokenValuesBatch`,
`CriticTrainRequest` -> `CriticTrainReply`), validated by the same `transport.messages` converters on
both ends. `P2PCriticClient` is the trainer's `roles.interfaces.CriticClient` for one such peer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.roles.interfaces import WorkerFailure
from decentralized_verl.roles.samples import Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers import p2p as wire

VALUES = "dverl.Critic/Values"
TRAIN = "dverl.Critic/Train"


def pairs(samples: Sequence[Sample]) -> tuple[m.SequencePair, ...]:
    return tuple(m.SequencePair(tuple(s.prompt.token_ids), tuple(s.response_ids)) for s in samples)


class CriticEndpoint:
    """Values / Train handlers around a `roles.scoring.CriticWorker`.

    `coordinator=None` serves any caller (the open quick-start job, trusted networks only); otherwise
    only that peer id (authenticated by libp2p's secure channel) may call.
    """

    def __init__(self, p2p, worker, *, coordinator: str | None, limits: m.WireLimits | None = None) -> None:
        self.p2p = p2p
        self.worker = worker
        self.coordinator = coordinator
        self.limits = limits or m.WireLimits()
        self.values_requests = 0
        self.train_steps = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(VALUES, self._values, pb.SequenceBatch)
        await self.p2p.add_protobuf_handler(TRAIN, self._train, pb.CriticTrainRequest)

    def _authorize(self, context) -> None:
        caller = context.remote_id.to_base58()
        if self.coordinator is not None and caller != self.coordinator:
            raise wire.Unauthorized(f"only the job's coordinator may use this critic (not {caller})")

    async def _values(self, request: pb.SequenceBatch, context) -> pb.TokenValuesBatch:
        from decentralized_verl.roles.scoring import samples_from_pairs

        self._authorize(context)
        batch = m.sequence_batch_from_proto(request, self.limits)
        values = await asyncio.to_thread(self.worker.values, samples_from_pairs(batch.items))
        self.values_requests += 1
        return m.token_values_to_proto(
            m.TokenValues(tuple(values), batch.policy_version, self.worker.worker_id)
        )

    async def _train(self, request: pb.CriticTrainRequest, context) -> pb.CriticTrainReply:
        from decentralized_verl.roles.scoring import samples_from_pairs

        self._authorize(context)
        items, version = m.critic_train_request_from_proto(request, self.limits)
        loss = await asyncio.to_thread(
            self.worker.train,
            samples_from_pairs([it.sequence for it in items]),
            [it.returns for it in items],
            [it.old_values for it in items],
            version,
        )
        self.train_steps += 1
        return pb.CriticTrainReply(loss=loss, version=self.worker.version)


class P2PCriticClient:
    """`CriticClient` for a critic peer; any transport or contract failure raises WorkerFailure."""

    def __init__(self, p2p, peer_id: str, *, deadline_s: float = 600.0) -> None:
        self.p2p = p2p
        self.peer_id = peer_id
        self.worker_id = f"critic-{peer_id[-8:]}"
        self.deadline_s = deadline_s

    async def _call(self, name: str, message, reply_type):
        try:
            return await asyncio.wait_for(
                self.p2p.call_protobuf_handler(wire.peer(self.peer_id), name, message, reply_type),
                self.deadline_s,
            )
        except TimeoutError:
            raise WorkerFailure(self.worker_id, f"{name}: no answer within {self.deadline_s:g}s") from None
        except Exception as exc:  # the peer vanished or its handler failed (hivemind's P2PHandlerError)
            raise WorkerFailure(self.worker_id, f"{name}: {type(exc).__name__}: {exc}") from None

    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(pairs(samples))
        reply = await self._call(VALUES, m.sequence_batch_to_proto(request), pb.TokenValuesBatch)
        try:
            return list(m.token_values_from_proto(reply, request, logprobs=False).values)
        except WireError as exc:
            raise WorkerFailure(self.worker_id, f"Values: {exc}") from None

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        items = [
            m.CriticTrainItem(pair, tuple(map(float, r)), tuple(map(float, v)))
            for pair, r, v in zip(pairs(samples), returns, old_values, strict=True)
        ]
        reply = await self._call(
            TRAIN, m.critic_train_request_to_proto(items, policy_version), pb.CriticTrainReply
        )
        if not math.isfinite(reply.loss):
            raise WorkerFailure(self.worker_id, f"Train: loss is not finite ({reply.loss})")
        return float(reply.loss)

    async def close(self) -> None:
        return None
