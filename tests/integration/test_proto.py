"""The wire contract: generated code is current, fields are documented, a real gRPC round trip works.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.grpc_options import (
    MAX_MESSAGE_BYTES,
    channel_options,
    server_options,
)

# ------------------------------------------------------------------------------------------------
# A real grpc.aio server on 127.0.0.1
# ------------------------------------------------------------------------------------------------

BIG_CHUNK = bytes(range(256)) * (5 * 1024 * 1024 // 256)  # 5 MiB: above gRPC's 4 MiB default limit


class _Health(pb_grpc.HealthServicer):
    async def Ready(self, request: pb.ReadyRequest, context: grpc.aio.ServicerContext) -> pb.ReadyReply:
        return m.readiness_to_proto(m.Readiness(True, "rollout", "rollout-0"))


class _Rollout(pb_grpc.RolloutServicer):
    """Trivial generation: the response is the reversed prompt; results stream back in reverse order."""

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        try:
            batch = m.generate_request_from_proto(request, m.WireLimits(vocab_size=100))
        except WireError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        for item in reversed(batch.items):
            for k in range(batch.sampling.n):
                await asyncio.sleep(0)
                ids = tuple(reversed(item.prompt_token_ids))[: batch.sampling.max_new_tokens]
                yield m.completion_to_proto(
                    m.Completion(
                        request_id=batch.request_id,
                        prompt_id=item.prompt_id,
                        sample_index=item.sample_index + k,
                        response_token_ids=ids,
                        logprobs=tuple(-0.25 * (j + 1) for j in range(len(ids))),
                        finish_reason="length" if len(ids) == batch.sampling.max_new_tokens else "stop",
                        text=" ".join(map(str, ids)),
                        policy_version=batch.policy_version,
                        worker_id="rollout-0",
                        generation_seconds=0.001,
                    )
                )


class _Weights(pb_grpc.WeightsServicer):
    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext):
        digest = digest_hex(BIG_CHUNK)
        yield pb.WeightChunk(version=request.version, index=0, total=1, data=BIG_CHUNK, digest=digest)


@pytest.fixture
async def server_address():
    server = grpc.aio.server(options=server_options())
    pb_grpc.add_HealthServicer_to_server(_Health(), server)
    pb_grpc.add_RolloutServicer_to_server(_Rollout(), server)
    pb_grpc.add_WeightsServicer_to_server(_Weights(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_health_ready_round_trip(server_address: str) -> None:
    async with grpc.aio.insecure_channel(server_address, options=channel_options()) as channel:
        reply = await pb_grpc.HealthStub(channel).Ready(pb.ReadyRequest(), timeout=5)
    assert m.readiness_from_proto(reply) == m.Readiness(True, "rollout", "rollout-0")


async def test_generate_streams_every_sample_once(server_address: str) -> None:
    batch = m.GenerateBatch(
        request_id="step3-a",
        policy_version=3,
        sampling=m.SamplingParams(max_new_tokens=3, temperature=0.7, n=2),
        items=(m.GenerateItem("p0", 0, (1, 2, 3, 4)), m.GenerateItem("p1", 0, (7, 8))),
    )
    limits = m.WireLimits(vocab_size=100)
    async with grpc.aio.insecure_channel(server_address, options=channel_options()) as channel:
        stream = pb_grpc.RolloutStub(channel).Generate(m.generate_request_to_proto(batch), timeout=5)
        completions = [
            m.completion_from_proto(msg, limits=limits, request=batch, path=f"results[{i}]")
            async for i, msg in _aenumerate(stream)
        ]
    m.check_all_answered(batch, completions)
    assert [c.key for c in completions] == [("p1", 0), ("p1", 1), ("p0", 0), ("p0", 1)]
    by_key = {c.key: c for c in completions}
    assert by_key["p0", 1].response_token_ids == (4, 3, 2)
    assert by_key["p0", 1].finish_reason == "length"
    assert by_key["p1", 0].response_token_ids == (8, 7)
    assert by_key["p1", 0].finish_reason == "stop"
    assert by_key["p1", 0].logprobs == (-0.25, -0.5)
    assert {c.policy_version for c in completions} == {3}


async def test_generate_rejects_a_bad_request_with_the_field(server_address: str) -> None:
    request = pb.GenerateRequest(
        request_id="r",
        policy_version=0,
        sampling=pb.SamplingParams(max_new_tokens=4, top_p=1.0, n=1),
        items=[pb.GenerateItem(prompt_id="p0", prompt_token_ids=[1, 100])],
    )
    async with grpc.aio.insecure_channel(server_address, options=channel_options()) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in pb_grpc.RolloutStub(channel).Generate(request, timeout=5):
                pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "items[0].prompt_token_ids[1]: token id 100 is outside [0, 100)"


async def test_unimplemented_method_is_reported(server_address: str) -> None:
    async with grpc.aio.insecure_channel(server_address, options=channel_options()) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RolloutStub(channel).Info(pb.InfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_message_size_options_lift_the_4mib_default(server_address: str) -> None:
    assert len(BIG_CHUNK) < MAX_MESSAGE_BYTES
    async with grpc.aio.insecure_channel(server_address, options=channel_options()) as channel:
        chunks = [c async for c in pb_grpc.WeightsStub(channel).Fetch(pb.FetchRequest(version=2), timeout=10)]
    assert len(chunks) == 1 and chunks[0].data == BIG_CHUNK and chunks[0].version == 2
    # Without our options the same message is refused by the client's default receive limit.
    async with grpc.aio.insecure_channel(server_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in pb_grpc.WeightsStub(channel).Fetch(pb.FetchRequest(version=2), timeout=10):
                pass
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def _aenumerate(stream):
    i = 0
    async for item in stream:
        yield i, item
        i += 1
