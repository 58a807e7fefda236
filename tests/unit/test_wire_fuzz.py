"""Fuzzing the wire: every message a worker, a coordinator or a volunteer decodes, built field by field
from its protobuf descriptor with hostile values (huge and negative numbers, NaN, long and odd text,
unknown enum values, many items), goes through its decoder, which either accepts it or raises WireError
naming the field: never another exception. Then the same against real secured gRPC servers: random
bytes and random messages to every method, from a caller holding the job's token, end in a status code,
never a crash or a hang, and the server answers afterwards. Seeded and bounded, so each run is the same
few seconds of work.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.wire.rollout import sampling_from_proto
from tests.support.wire_strategies import message_strategy, wire_bytes

FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMITS = m.WireLimits(vocab_size=1000, max_batch=64, max_prompt_tokens=256, max_new_tokens=128)


# ------------------------------------------------------------------------------------- decoders

_REQUEST = m.sequence_batch_from_proto(
    pb.SequenceBatch(items=[pb.Sequence(prompt_token_ids=[1, 2], response_token_ids=[3, 4, 5])]), LIMITS
)
_GENERATE = m.generate_request_from_proto(
    pb.GenerateRequest(
        request_id="r", policy_version=3,
        sampling=pb.SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, n=1),
        items=[pb.GenerateItem(prompt_id="p", prompt_token_ids=[1, 2])],
    ),
    LIMITS,
)  # fmt: skip
_MANIFEST = WeightPublisher(chunk_bytes=64, signing_key=None)
_MANIFEST.publish({"w": torch.arange(40, dtype=torch.float32)}, 1)
_HELD = _MANIFEST.get(1).manifest

DECODERS = {
    "GenerateRequest": (pb.GenerateRequest, lambda msg: m.generate_request_from_proto(msg, LIMITS)),
    "GenerateResult": (
        pb.GenerateResult,
        lambda msg: m.completion_from_proto(msg, limits=LIMITS, request=_GENERATE, expected_version=3),
    ),
    "SamplingParams": (pb.SamplingParams, lambda msg: sampling_from_proto(msg, LIMITS)),
    "SequenceBatch": (pb.SequenceBatch, lambda msg: m.sequence_batch_from_proto(msg, LIMITS)),
    "TokenValuesBatch": (
        pb.TokenValuesBatch,
        lambda msg: m.token_values_from_proto(msg, _REQUEST, logprobs=True, expected_version=2),
    ),
    "CriticTrainRequest": (pb.CriticTrainRequest, lambda msg: m.critic_train_request_from_proto(msg, LIMITS)),
    "ScoreRequest": (pb.ScoreRequest, lambda msg: m.score_request_from_proto(msg, LIMITS)),
    "ScoreResponse": (pb.ScoreResponse, lambda msg: m.scores_from_proto(msg, 2)),
    "JobStatus": (pb.JobStatus, m.job_status_from_proto),
    "JoinRequest": (pb.JoinRequest, m.join_request_from_proto),
    "JoinReply": (pb.JoinReply, m.join_reply_from_proto),
    "HeartbeatRequest": (pb.HeartbeatRequest, m.heartbeat_from_proto),
    "ReadyReply": (pb.ReadyReply, m.readiness_from_proto),
    "WorkerInfo": (pb.WorkerInfo, m.worker_info_from_proto),
    "WeightManifest": (pb.WeightManifest, m.manifest_from_proto),
    "WeightChunk": (pb.WeightChunk, lambda msg: m.chunk_from_proto(msg, _HELD)),
}


def decode_or_refuse(decode, msg) -> None:
    try:
        decode(msg)
    except WireError as exc:
        assert exc.field and str(exc).startswith(exc.field), "a refusal names the field"


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_every_decoder_accepts_or_names_the_field_for_any_message(name: str) -> None:
    cls, decode = DECODERS[name]

    @seed(20261126)
    @FUZZ
    @given(message_strategy(cls.DESCRIPTOR))
    def structured(msg) -> None:
        decode_or_refuse(decode, msg)

    @seed(20261127)
    @FUZZ
    @given(wire_bytes(cls.DESCRIPTOR))
    def raw(data: bytes) -> None:
        try:
            msg = cls.FromString(data)
        except Exception:  # the protobuf runtime refuses it: gRPC answers INTERNAL, nothing runs
            return
        decode_or_refuse(decode, msg)

    structured()
    raw()


def test_an_oversized_batch_is_refused_before_it_is_walked() -> None:
    """No request makes a worker allocate per item beyond `max_batch`: the count is checked first."""
    huge = pb.ScoreRequest(items=[pb.ScoreItem(completion_text="x", reward_type="boxed")] * 100_000)
    with pytest.raises(WireError, match=r"items.*64"):
        m.score_request_from_proto(huge, LIMITS)
    ids = pb.SequenceBatch(items=[pb.Sequence(prompt_token_ids=[1] * 100_000, response_token_ids=[2])])
    with pytest.raises(WireError, match="prompt_token_ids"):
        m.sequence_batch_from_proto(ids, LIMITS)


"""UNKNOWN (an exception escaped a servicer) or DEADLINE_EXCEEDED (a hang) fail the test."""
