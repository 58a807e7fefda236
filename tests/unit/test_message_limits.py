"""The one table of request size limits: every method it names exists and some role may call it, a server
takes no more than its largest method needs, and a refusal names the method and the limit."""

from __future__ import annotations

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.security.rights import RIGHTS
from decentralized_verl.transport import message_limits as ml
from decentralized_verl.transport.grpc_options import channel_options, server_options

CALLABLE = frozenset().union(*RIGHTS.values())


def test_every_limited_method_is_one_a_role_may_call() -> None:
    assert set(ml.LIMITS) <= CALLABLE, set(ml.LIMITS) - CALLABLE


def test_every_method_of_the_wire_contract_has_a_limit_no_larger_than_the_largest() -> None:
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            limit = ml.limit_of(f"{service.name}/{method.name}")
            assert ml.DEFAULT_BYTES <= limit <= ml.LARGEST_BYTES


def test_control_methods_take_the_small_default() -> None:
    for method in (
        "Health/Ready",
        "Coordinator/Status",
        "Rollout/Info",
        "Weights/GetManifest",
        "Weights/Fetch",
        "Span/Close",
        "Span/Info",
        "Volunteer/Join",
    ):
        assert ml.limit_of(method) == ml.DEFAULT_BYTES == 64 << 10, method


def test_a_server_takes_what_its_largest_method_needs() -> None:
    assert ml.server_limit(("Health",)) == ml.DEFAULT_BYTES
    assert ml.server_limit(("Coordinator", "Weights", "Health")) == ml.WEIGHT_CHUNK_BYTES
    assert ml.server_limit(("Reward", "Health")) == ml.BATCH_BYTES
    assert ml.server_limit(("Rollout", "Health", "Weights")) == ml.PROMPT_BATCH_BYTES
    assert ml.server_limit(None) == ml.LARGEST_BYTES


def test_the_server_option_is_the_servers_limit_and_channels_keep_theirs() -> None:
    assert dict(server_options(("Health",)))["grpc.max_receive_message_length"] == 64 << 10
    assert dict(server_options(("Reward",)))["grpc.max_receive_message_length"] == 64 << 20
    assert dict(channel_options())["grpc.max_receive_message_length"] == 64 << 20


def test_a_refusal_names_the_method_its_limit_and_the_size() -> None:
    assert ml.over_limit("Health/Ready", 64 << 10) is None
    why = ml.over_limit("Health/Ready", (64 << 10) + 1)
    assert why == "the request is 65537 bytes, over Health/Ready's limit of 65536 bytes"
    assert ml.over_limit("Reward/Score", 63 << 20) is None
