"""Reward (and, by the same pool, reference and critic) calls survive a worker that dies, restarts,
hangs or lies: real gRPC workers on 127.0.0.1, the learner's own ScoringPool in front of them."""

from __future__ import annotations

import asyncio
import math

import pytest

from decentralized_verl.core.interfaces import WorkerFailure
from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.orchestration import failover
from decentralized_verl.orchestration.failover import ScoringPool
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc
from decentralized_verl.serving.scoring import RewardWorker
from decentralized_verl.serving.servicers import HealthServicer, RewardServicer, serve
from decentralized_verl.transport.clients import GrpcRewardClient
from tests.support.processes import free_port


def samples(n: int) -> list[Sample]:
    return [
        Sample(
            Prompt(f"p{i}", i, (1,), "q", ground_truth=str(i)), 0, (2,), (-0.1,), "stop", rf"\boxed{{{i}}}", 0
        )
        for i in range(n)
    ]


async def reward_server(port: int, servicer=None):
    return await serve(
        port, servicer or RewardServicer(RewardWorker(None)), HealthServicer("reward", f"r{port}", ready=True)
    )


class Lying(dverl_pb2_grpc.RewardServicer):
    async def Score(self, request, context):
        return pb.ScoreResponse(results=[pb.ScoreResult(score=math.nan, reason="x") for _ in request.items])


class Hanging(dverl_pb2_grpc.RewardServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def Score(self, request, context):
        self.calls += 1
        await asyncio.sleep(3600)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(failover, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(failover, "CALL_FLOOR_S", 1.0)


async def test_a_dead_replica_fails_over_and_every_sample_is_scored_once() -> None:
    ports = [free_port(), free_port()]
    servers = [await reward_server(p) for p in ports]
    pool = ScoringPool(
        "reward",
        [GrpcRewardClient(f"127.0.0.1:{p}", worker_id=f"r{i}") for i, p in enumerate(ports)],
        split=True,
    )
    try:
        assert [s for s, _ in await pool.score(samples(6), "boxed")] == [1.0] * 6  # spread over both
        await servers[0].stop(None)  # one replica dies
        assert [s for s, _ in await pool.score(samples(6), "boxed")] == [1.0] * 6
        assert any(f.startswith("r0: ") and "UNAVAILABLE" in f for f in pool.report.failures)
        assert not pool.gate.is_up("r0")
    finally:
        await pool.close()
        await servers[1].stop(None)


async def test_a_single_replica_is_waited_for_until_it_is_back() -> None:
    port = free_port()
    server = await reward_server(port)
    pool = ScoringPool("reward", [GrpcRewardClient(f"127.0.0.1:{port}", worker_id="r0")], split=True)
    try:
        await pool.score(samples(2), "boxed")
        await server.stop(None)

        async def restart_later():
            await asyncio.sleep(1.5)  # a restart takes a while; the call must wait, not fail
            return await reward_server(port)

        restarted = asyncio.create_task(restart_later())
        assert [s for s, _ in await pool.score(samples(3), "boxed")] == [1.0] * 3
        server = await restarted
        assert pool.gate.returned == ["r0"]
    finally:
        await pool.close()
        await server.stop(None)


async def test_a_lying_or_hung_replica_is_held_out_and_its_share_redone() -> None:
    good, liar, hung = free_port(), free_port(), free_port()
    hanging = Hanging()
    servers = [
        await reward_server(good),
        await reward_server(liar, Lying()),
        await reward_server(hung, hanging),
    ]
    clients = [
        GrpcRewardClient(f"127.0.0.1:{p}", worker_id=n)
        for n, p in (("good", good), ("liar", liar), ("hung", hung))
    ]
    pool = ScoringPool("reward", clients, split=True)
    pool.speed["hung"].observe(10, 0.01)  # measured fast before: a share may take ~1 s, not an hour
    try:
        scores = await asyncio.wait_for(pool.score(samples(9), "boxed"), 30)
        assert [s for s, _ in scores] == [1.0] * 9
        failed = {f.split(":")[0] for f in pool.report.failures}
        assert failed == {"liar", "hung"} and hanging.calls >= 1
        assert any("liar: Score: results[0].score: must be finite" in f for f in pool.report.failures)
    finally:
        await pool.close()
        for server in servers:
            await server.stop(None)


async def test_past_the_deadline_the_call_fails_naming_the_role() -> None:
    pool = ScoringPool(
        "reward", [GrpcRewardClient(f"127.0.0.1:{free_port()}", worker_id="r0")], split=True, deadline_s=1.0
    )
    try:
        with pytest.raises(WorkerFailure, match=r"no reward worker answered within 1s .*UNAVAILABLE"):
            await pool.score(samples(2), "boxed")
    finally:
        await pool.close()


async def test_the_critic_pool_sends_every_call_to_one_replica_in_order() -> None:
    class Recording:
        def __init__(self, wid, fail=False):
            self.worker_id, self.fail, self.calls = wid, fail, []

        async def values(self, batch):
            self.calls.append(len(batch))
            if self.fail:
                raise WorkerFailure(self.worker_id, "gone")
            return [(0.0,) for _ in batch]

        async def close(self):
            pass

    first, second = Recording("c0", fail=True), Recording("c1")
    pool = ScoringPool("critic", [first, second], split=False)
    # c0 cannot be probed, so it is retried (in order) before c1 is used only if c0 is held out; here
    # c0 keeps failing without a Health to ask, so the call fails over to nobody and hits the deadline.
    pool.deadline_s = 0.5
    with pytest.raises(WorkerFailure):
        await pool.values(samples(4))
    assert second.calls == [] and all(n == 4 for n in first.calls)
