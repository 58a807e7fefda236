"""What a serving role does with a request once it is validated, whichever transport brought it.

The gRPC servicers (servicers.py) and the P2P endpoints (p2p_endpoints.py) each validate the request
with `transport.messages`, authorize the caller their own way and map failures to their own error
model; the work in between (run the worker off the event loop, shape its answer) is written once here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.runtime import compute_thread
from decentralized_verl.serving.local import stream_in_thread
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.scoring import CriticWorker, RewardWorker, samples_from_pairs
from decentralized_verl.transport import messages as m


def work_items(batch: m.GenerateBatch) -> list[tuple[Prompt, int]]:
    """(prompt, sample index) per completion the request asks for: `n` consecutive indices an item."""
    return [
        (Prompt(it.prompt_id, 0, it.prompt_token_ids, it.prompt_text, it.ground_truth), it.sample_index + k)
        for it in batch.items
        for k in range(batch.sampling.n)
    ]


def episode_report(sample: Sample) -> m.EpisodeReport | None:
    """What a multi-turn sample adds on the wire (None for a single completion)."""
    if sample.loss_mask is None:
        return None
    return m.EpisodeReport(
        loss_mask=sample.loss_mask,
        turns=sample.turns,
        end_reason=sample.end_reason,
        tool_calls=int(sample.extra.get("tool_calls", 0)),
        tool_errors=int(sample.extra.get("tool_errors", 0)),
        reward=float(sample.extra.get("episode_reward", 0.0)),
    )


async def completions(worker: RolloutWorker, batch: m.GenerateBatch) -> AsyncIterator[m.Completion]:
    """One Completion per requested sample, as each of the worker's micro-batches finishes."""
    items = work_items(batch)
    sampling = batch.sampling
    async for sample in stream_in_thread(lambda: worker.generate_sync(items, sampling, batch.policy_version)):
        yield m.Completion(
            request_id=batch.request_id,
            prompt_id=sample.prompt.prompt_id,
            sample_index=sample.sample_index,
            response_token_ids=sample.response_ids,
            logprobs=sample.logprobs,
            finish_reason=sample.finish_reason,
            text=sample.text,
            policy_version=sample.policy_version,
            worker_id=worker.worker_id,
            generation_seconds=float(sample.extra.get("generation_seconds", 0.0)),
            episode=episode_report(sample),
        )


async def token_values(
    compute: Callable[[Sequence[Sample]], list[tuple[float, ...]]], batch: m.SequenceBatch, worker_id: str
) -> pb.TokenValuesBatch:
    """Per-token numbers (reference log-probs, critic values) for each sequence of the batch."""
    values = await compute_thread.run(compute, samples_from_pairs(batch.items))
    return m.token_values_to_proto(m.TokenValues(tuple(values), batch.policy_version, worker_id))


async def critic_update(
    worker: CriticWorker, items: Sequence[m.CriticTrainItem], policy_version: int
) -> pb.CriticTrainReply:
    """One value-model update on the given returns; the reply carries the mean loss."""
    loss = await compute_thread.run(
        worker.train,
        samples_from_pairs([it.sequence for it in items]),
        [it.returns for it in items],
        [it.old_values for it in items],
        policy_version,
    )
    return pb.CriticTrainReply(loss=loss, version=worker.version)


async def scores(worker: RewardWorker, items: Sequence[m.ScoreItem]) -> pb.ScoreResponse:
    """A (score, reason) per item; a bad completion scores 0 with a reason, never an error."""
    return m.scores_to_proto(await asyncio.to_thread(worker.score_items, list(items)))
