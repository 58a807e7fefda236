"""The wire contract: generated code is current, fields are documented, a real gRPC round trip works."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.proto import generate
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.grpc_options import (
    MAX_MESSAGE_BYTES,
    channel_options,
    server_options,
)
from decentralized_verl.transport.weights.digest import digest_hex

PROTO_ROOT = generate.default_proto_root()


# ------------------------------------------------------------------------------------------------
# Generated code and the .proto source
# ------------------------------------------------------------------------------------------------


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    written = generate.generate(tmp_path, PROTO_ROOT)
    fresh = {p.name: p.read_bytes() for p in written}
    checked_in = {p.name: p.read_bytes() for p in generate.generated_files(generate.PACKAGE_DIR)}
    assert set(fresh) == {"dverl_pb2.py", "dverl_pb2_grpc.py", "dverl_pb2.pyi"}
    assert set(checked_in) == set(fresh), "run `python -m decentralized_verl.proto.generate`"
    for name, data in fresh.items():
        assert checked_in[name] == data, f"{name} is stale: run `python -m decentralized_verl.proto.generate`"


def test_generate_removes_stale_modules_and_cli_writes(tmp_path: Path) -> None:
    stale = tmp_path / "gone_pb2.py"
    stale.write_text("# from a removed .proto\n")
    keep = tmp_path / "__init__.py"
    keep.write_text("")
    assert generate.main(["--out", str(tmp_path), "--proto-root", str(PROTO_ROOT)]) == 0
    assert not stale.exists()
    assert keep.exists()
    assert (
        (tmp_path / "dverl_pb2_grpc.py").read_text().count("from decentralized_verl.proto import dverl_pb2")
    )


def test_generate_without_sources_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--out", str(tmp_path / "out"), "--proto-root", str(tmp_path)]) == 2
    assert "no .proto files" in capsys.readouterr().err


def _proto_source() -> str:
    return (PROTO_ROOT / "decentralized_verl" / "proto" / "dverl.proto").read_text()


def test_every_field_and_enum_value_has_a_comment() -> None:
    field_line = re.compile(r"^\s+(optional |repeated )?(map<[^>]+>|[\w.]+) \w+ = \d+( \[[^\]]*\])?;")
    enum_line = re.compile(r"^\s+[A-Z][A-Z0-9_]+ = \d+;")
    undocumented = [
        line.strip()
        for line in _proto_source().splitlines()
        if (field_line.match(line) or enum_line.match(line)) and "//" not in line
    ]
    assert undocumented == []


def test_package_and_services_are_the_contract() -> None:
    assert pb.DESCRIPTOR.package == "dverl.v1"
    services = {name: sorted(s.methods_by_name) for name, s in pb.DESCRIPTOR.services_by_name.items()}
    assert services == {
        "Rollout": ["Generate", "Info"],
        "Weights": ["Fetch", "GetManifest", "Push"],
        "Reward": ["Score"],
        "Reference": ["LogProbs"],
        "Critic": ["Train", "Values"],
        "Coordinator": ["Status"],
        "Volunteer": ["Heartbeat", "Join"],
        "Health": ["Ready"],
    }
    generate_rpc = pb.DESCRIPTOR.services_by_name["Rollout"].methods_by_name["Generate"]
    assert generate_rpc.server_streaming and not generate_rpc.client_streaming
    push = pb.DESCRIPTOR.services_by_name["Weights"].methods_by_name["Push"]
    assert push.client_streaming and not push.server_streaming


def test_token_ids_are_packed_on_the_wire() -> None:
    # Packed: one tag + one length + varints. 1000 ids below 128 take ~1003 bytes, not ~2000.
    msg = pb.GenerateResult(response_token_ids=[5] * 1000, logprobs=[-0.5] * 1000)
    size = len(msg.SerializeToString())
    assert size == (1 + 2 + 1000) + (1 + 2 + 4 * 1000)


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


def test_options_are_deliberate() -> None:
    server, channel = dict(server_options()), dict(channel_options())
    assert channel["grpc.max_receive_message_length"] == channel["grpc.max_send_message_length"] == 64 << 20
    assert channel["grpc.keepalive_permit_without_calls"] == 1
    assert channel["grpc.keepalive_timeout_ms"] < channel["grpc.keepalive_time_ms"]
    # A server that forbids pings more frequent than the clients send them would GOAWAY its clients.
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < channel["grpc.keepalive_time_ms"]
    assert channel_options() is not channel_options()  # callers may extend their copy


async def _aenumerate(stream):
    i = 0
    async for item in stream:
        yield i, item
        i += 1
