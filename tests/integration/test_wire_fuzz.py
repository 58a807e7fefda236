"""Fuzzing the wire: every message a worker, a coordinator or a volunteer decodes, built field by field
from its protobuf descriptor with hostile values (huge and negative numbers, NaN, long and odd text,
unknown enum values, many items), goes through its decoder, which either accepts it or raises WireError
naming the field: never another exception. Then the same against real secured gRPC servers: random
bytes and random messages to every method, from a caller holding the job's token, end in a status code,
never a crash or a hang, and the server answers afterwards. Seeded and bounded, so each run is the same
few seconds of work.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from decentralized_verl.core.status import StatusBoard
from decentralized_verl.orchestration.status_service import CoordinatorServicer
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.security import credentials as cr
from decentralized_verl.security import trust
from decentralized_verl.serving.scoring import RewardWorker
from decentralized_verl.serving.servicers import HealthServicer, RewardServicer, serve
from decentralized_verl.transport import secure
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.service import WeightsServicer
from tests.support.wire_strategies import wire_bytes

FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_MANIFEST = WeightPublisher(chunk_bytes=64, signing_key=None)
_MANIFEST.publish({"w": torch.arange(40, dtype=torch.float32)}, 1)


# ------------------------------------------------------------------------------------- live servers

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
"""UNKNOWN (an exception escaped a servicer) or DEADLINE_EXCEEDED (a hang) fail the test."""

TARGETS = {
    "/dverl.v1.Reward/Score": (pb.ScoreRequest, False, False),
    "/dverl.v1.Weights/GetManifest": (pb.ManifestRequest, False, False),
    "/dverl.v1.Weights/Fetch": (pb.FetchRequest, False, True),
    "/dverl.v1.Weights/Push": (pb.WeightChunk, True, False),
    "/dverl.v1.Coordinator/Status": (pb.StatusRequest, False, False),
    "/dverl.v1.Health/Ready": (pb.ReadyRequest, False, False),
}


@pytest.fixture()
def issued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> cr.IssuedCredentials:
    issued = cr.run_folder_credentials(tmp_path / "run", "fuzz-job").issued
    monkeypatch.setattr(trust, "_given", str(cr.write(tmp_path / "learner", issued, "learner")))
    return issued


def _call(channel, path: str, payloads: list[bytes], streaming_in: bool, streaming_out: bool):
    ser = de = lambda raw: raw  # bytes as they are: the server parses them
    try:
        if streaming_in:
            channel.stream_unary(path, ser, de)(iter(payloads), timeout=20)
        elif streaming_out:
            list(channel.unary_stream(path, ser, de)(payloads[0], timeout=20))
        else:
            channel.unary_unary(path, ser, de)(payloads[0], timeout=20)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


async def test_live_servers_answer_any_bytes_with_a_status(issued: cr.IssuedCredentials) -> None:
    publisher = WeightPublisher(chunk_bytes=64, signing_key=issued.signing_key)
    publisher.publish({"w": torch.arange(40, dtype=torch.float32)}, 1)
    server = await serve(
        0,
        RewardServicer(RewardWorker("boxed")),
        WeightsServicer(publisher),
        CoordinatorServicer(StatusBoard()),
        HealthServicer("reward", "fuzz-0", ready=True),
    )
    address = f"127.0.0.1:{server.port}"
    learner = issued.for_role("learner")
    seen: dict[str, set] = {path: set() for path in TARGETS}

    def fuzz(channel, path: str) -> None:
        cls, streaming_in, streaming_out = TARGETS[path]

        @seed(len(path))
        @settings(FUZZ, max_examples=25)
        @given(st.lists(wire_bytes(cls.DESCRIPTOR), min_size=1, max_size=4))
        def one(payloads: list[bytes]) -> None:
            code, details = _call(channel, path, payloads, streaming_in, streaming_out)
            assert code in ALLOWED, (path, code, details)
            seen[path].add(code)

        one()

    def attack() -> None:
        with secure.sync_channel(address, learner) as channel:
            for path in TARGETS:
                fuzz(channel, path)
            ready = channel.unary_unary("/dverl.v1.Health/Ready", lambda r: r, pb.ReadyReply.FromString)
            assert ready(b"", timeout=10).ready  # still serving

    try:
        await asyncio.to_thread(attack)
    finally:
        await server.stop(None)
    assert grpc.StatusCode.INVALID_ARGUMENT in seen["/dverl.v1.Reward/Score"] | seen["/dverl.v1.Weights/Push"]
    assert publisher.versions == [1]  # nothing a fuzzer sent was taken as weights
