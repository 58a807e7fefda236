"""Dispatch: throughput-weighted shares, re-dispatch after failures, every item answered exactly once.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio

import pytest

from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.orchestration.dispatch import Dispatcher
from tests.support.fake_workers import FakeRollout, items


async def test_every_item_once_and_slow_worker_gets_less_after_measuring():
    fast, slow = FakeRollout("fast", delay=0.001), FakeRollout("slow", delay=0.02)
    dispatcher = Dispatcher([fast, slow])
    work = items(8, 4)
    samples, report = await dispatcher.run(work, SamplingParams(max_new_tokens=4), version=3)
    assert [s.key for s in samples] == [(p.prompt_id, k) for p, k in work]
    assert report.assigned == {"fast": 16, "slow": 16}
    samples, report = await dispatcher.run(work, SamplingParams(max_new_tokens=4), version=3)
    assert len({s.key for s in samples}) == len(work)
    assert report.assigned["fast"] > 3 * report.assigned["slow"]
    assert all(s.policy_version == 3 for s in samples)


class _SlowServicer:
    """A real gRPC Rollout service that answers one sample a second (a worker still generating)."""

    def __init__(self) -> None:
        from decentralized_verl.proto import dverl_pb2_grpc

        class Servicer(dverl_pb2_grpc.RolloutServicer):
            async def Generate(self, request, context):
                from decentralized_verl.transport import messages as m

                batch = m.generate_request_from_proto(request, m.WireLimits())
                for item in batch.items:
                    await asyncio.sleep(1.0)
                    yield m.completion_to_proto(
                        m.Completion(
                            batch.request_id, item.prompt_id, item.sample_index, (5,), (-0.5,), "stop", "a",
                            batch.policy_version, "slow", 0.1,
                        )
                    )  # fmt: skip

        self.servicer = Servicer()


async def test_a_worker_removed_mid_step_is_that_workers_failure_not_the_steps() -> None:
    """Scaling closes a removed worker's channel while it streams: the step re-dispatches its items."""
    from decentralized_verl.serving.servicers import serve
    from decentralized_verl.transport.clients import GrpcRolloutClient

    server = await serve(0, _SlowServicer().servicer)
    try:
        slow = GrpcRolloutClient(f"127.0.0.1:{server.port}", worker_id="slow")
        fast = FakeRollout("fast")
        dispatcher = Dispatcher([slow, fast], priors={"slow": 1.0, "fast": 1.0})

        async def remove_slow_soon() -> None:
            await asyncio.sleep(0.3)
            dispatcher.remove("slow")
            await slow.close()  # what membership does for a pod scaled away

        remover = asyncio.create_task(remove_slow_soon())
        samples, report = await dispatcher.run(items(4, 2), SamplingParams(max_new_tokens=4), version=0)
        await remover
        assert sorted(s.key for s in samples) == sorted((p.prompt_id, k) for p, k in items(4, 2))
        assert report.redispatched >= 1 and any("slow" in f for f in report.failures)
        assert all(s.worker_id == "fast" for s in samples)
    finally:
        await server.stop(None)


async def test_cancelling_the_step_itself_still_cancels() -> None:
    dispatcher = Dispatcher([FakeRollout("a", delay=1.0)])
    task = asyncio.create_task(dispatcher.run(items(2, 1), SamplingParams(max_new_tokens=4), version=0))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class _FastServicer:
    def __init__(self) -> None:
        from decentralized_verl.proto import dverl_pb2_grpc

        class Servicer(dverl_pb2_grpc.RolloutServicer):
            async def Generate(self, request, context):
                from decentralized_verl.transport import messages as m

                batch = m.generate_request_from_proto(request, m.WireLimits())
                for item in batch.items:
                    yield m.completion_to_proto(
                        m.Completion(
                            batch.request_id, item.prompt_id, item.sample_index, (5,), (-0.5,), "stop", "a",
                            batch.policy_version, "w", 0.01,
                        )
                    )  # fmt: skip

        self.servicer = Servicer()


async def test_a_dead_worker_is_skipped_until_its_health_says_ready_then_rejoins() -> None:
    """No failure storm while a worker restarts: it fails once, is held out, and comes back by itself."""
    from decentralized_verl.orchestration import health
    from decentralized_verl.serving.servicers import HealthServicer, serve
    from decentralized_verl.transport.clients import GrpcRolloutClient
    from tests.support.processes import free_port

    port = free_port()
    server = await serve(port, _FastServicer().servicer, HealthServicer("rollout", "w", ready=True))
    client = GrpcRolloutClient(f"127.0.0.1:{port}", worker_id="w")
    dispatcher = Dispatcher([client, FakeRollout("fake")])
    dispatcher.gate = health.HealthGate(first_s=0.05, max_s=0.2)
    sampling = SamplingParams(max_new_tokens=4)
    try:
        await dispatcher.run(items(4, 2), sampling, version=0)
        await server.stop(None)  # the worker dies
        _, first = await dispatcher.run(items(4, 2), sampling, version=0)
        assert len(first.failures) == 1 and not dispatcher.gate.is_up("w")
        for _ in range(3):  # while it is down: no more failures, everything on the other worker
            _, report = await dispatcher.run(items(4, 2), sampling, version=0)
            assert report.failures == [] and set(report.assigned) == {"fake"}
        server = await serve(port, _FastServicer().servicer, HealthServicer("rollout", "w", ready=True))
        for _ in range(50):
            if dispatcher.gate.is_up("w"):
                break
            await asyncio.sleep(0.1)
        samples, report = await dispatcher.run(items(4, 2), sampling, version=0)
        assert "w" in report.assigned and report.failures == [] and len(samples) == 8
        assert dispatcher.gate.returned == ["w"]
    finally:
        await dispatcher.gate.close()
        await client.close()
        await server.stop(None)
