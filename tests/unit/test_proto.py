"""The wire contract: generated code is current, fields are documented, a real gRPC round trip works.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import generate
from decentralized_verl.transport.grpc_options import (
    channel_options,
    server_options,
)

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


def test_options_are_deliberate() -> None:
    server, channel = dict(server_options()), dict(channel_options())
    assert channel["grpc.max_receive_message_length"] == channel["grpc.max_send_message_length"] == 64 << 20
    assert channel["grpc.keepalive_permit_without_calls"] == 1
    assert channel["grpc.keepalive_timeout_ms"] < channel["grpc.keepalive_time_ms"]
    # A server that forbids pings more frequent than the clients send them would GOAWAY its clients.
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < channel["grpc.keepalive_time_ms"]
    assert channel_options() is not channel_options()  # callers may extend their copy
