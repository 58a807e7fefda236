"""The reference role over Hivemind P2P: a volunteer returns reference log-probs for token sequences.

Same messages as the in-cluster Reference gRPC service (`SequenceBatch` -> `TokenValuesBatch`),
validated by the same `transport.messages` converters on both ends (one finite log-prob <= 0 per
response token). The volunteer computes them with `roles.scoring.ReferenceWorker` over its `--model`
folder at the temperature it announces; a trainer uses it only when that folder is the trainer's own
initial policy and the temperatures agree (quickstart.py), otherwise it computes them itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.roles.interfaces import WorkerFailure
from decentralized_verl.roles.samples import Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers import p2p as wire
from decentralized_verl.volunteers.critic import pairs

LOGPROBS = "dverl.Reference/LogProbs"


class ReferenceEndpoint:
    """The LogProbs handler around a `roles.scoring.ReferenceWorker`; serves any caller (open mode)."""

    def __init__(self, p2p, worker, *, limits: m.WireLimits | None = None) -> None:
        self.p2p = p2p
        self.worker = worker
        self.limits = limits or m.WireLimits()
        self.requests = 0
        self.sequences = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(LOGPROBS, self._logprobs, pb.SequenceBatch)

    async def _logprobs(self, request: pb.SequenceBatch, context) -> pb.TokenValuesBatch:
        from decentralized_verl.roles.scoring import samples_from_pairs

        batch = m.sequence_batch_from_proto(request, self.limits)
        values = await asyncio.to_thread(self.worker.logprobs, samples_from_pairs(batch.items))
        self.requests += 1
        self.sequences += len(batch.items)
        return m.token_values_to_proto(
            m.TokenValues(tuple(values), batch.policy_version, self.worker.worker_id)
        )


class P2PReferenceClient:
    """`ReferenceClient` for a reference peer; any transport or contract failure raises WorkerFailure."""

    def __init__(self, p2p, peer_id: str, *, deadline_s: float = 600.0) -> None:
        self.p2p = p2p
        self.peer_id = peer_id
        self.worker_id = f"reference-{peer_id[-8:]}"
        self.deadline_s = deadline_s

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        request = m.SequenceBatch(pairs(samples))
        try:
            reply = await asyncio.wait_for(
                self.p2p.call_protobuf_handler(
                    wire.peer(self.peer_id), LOGPROBS, m.sequence_batch_to_proto(request), pb.TokenValuesBatch
                ),
                self.deadline_s,
            )
            return list(m.token_values_from_proto(reply, request, logprobs=True).values)
        except TimeoutError:
            raise WorkerFailure(self.worker_id, f"LogProbs: no answer within {self.deadline_s:g}s") from None
        except WireError as exc:
            raise WorkerFailure(self.worker_id, f"LogProbs: {exc}") from None
        except Exception as exc:  # the peer vanished or its handler failed (hivemind's P2PHandlerError)
            raise WorkerFailure(self.worker_id, f"LogProbs: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        return None
