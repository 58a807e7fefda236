"""The host staging weights leave a device through: host tensors pass untouched (no bucket, no copy);
the GPU path, bucket by bucket through pinned memory, runs in the GPU check (tests marked `gpu`); a
version is one buffer, each tensor copied straight into its place, the chunks views of it."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport.weights.codec import decode_bundle, encode_state_dict
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.push import HeldMessages
from decentralized_verl.transport.weights.staging import HostStaging, bucket_ranges


def test_a_host_tensor_is_used_as_it_is() -> None:
    staging = HostStaging(16)
    tensor = torch.arange(100, dtype=torch.float32)
    assert staging.to_host(tensor) is tensor
    assert staging.buckets == 0 and staging._buffer is None  # a CPU publisher never allocates it
    assert not staging.pin  # this process computes on the CPU: nothing is page-locked


def test_publishing_from_the_cpu_is_unchanged() -> None:
    state = {"a": torch.randn(4, 3), "b": torch.arange(5)}
    state["tied"] = state["a"]
    decoded = decode_bundle(encode_state_dict(state, 2, dtype=None))
    assert torch.equal(decoded["a"], state["a"]) and decoded["tied"] is decoded["a"]


def test_a_bucket_must_hold_a_byte() -> None:
    with pytest.raises(ValueError, match="bucket_bytes: must be >= 1"):
        HostStaging(0)


def test_a_version_is_one_buffer_its_chunks_are_views_of() -> None:
    state = {"emb": torch.randn(300, 40), "norm": torch.ones(40), "steps": torch.arange(7)}
    state["head"] = state["emb"]  # tied: sent once
    bundle = encode_state_dict(state, 5, dtype="bfloat16", chunk_bytes=4096)
    views = [c.data for c in bundle.chunks]
    assert all(isinstance(v, memoryview) and v.readonly for v in views)
    assert len({id(v.obj) for v in views}) == 1, "every chunk is a view of the one buffer, none a copy"
    assert sum(len(v) for v in views) == bundle.header.total_bytes
    decoded = decode_bundle(bundle)
    assert torch.equal(decoded["emb"], state["emb"].bfloat16()) and decoded["head"] is decoded["emb"]
    assert torch.equal(decoded["steps"], state["steps"]) and decoded["steps"].dtype == torch.int64


def test_a_slice_of_a_fused_buffer_is_copied_into_its_own_place() -> None:
    fused = torch.randn(6, 8)
    state = {"q": fused[:2], "kv": fused[2:], "t": fused[:, 1]}  # one storage, three views, one strided
    decoded = decode_bundle(encode_state_dict(state, 1, dtype=None))
    assert all(torch.equal(decoded[k], v) for k, v in state.items())


def test_device_buckets_cover_a_tensor_exactly() -> None:
    assert bucket_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert bucket_ranges(8, 4) == [(0, 4), (4, 8)] and bucket_ranges(0, 4) == []
    staging = HostStaging(16)
    target = torch.zeros(12, dtype=torch.uint8)
    staging.copy_into(torch.arange(3, dtype=torch.int32), target)
    assert torch.equal(target.view(torch.int32), torch.arange(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="target: holds 12 bytes, the tensor has 8"):
        staging.copy_into(torch.arange(2, dtype=torch.int32), target)


def test_a_learner_holds_its_version_once_and_makes_each_message_when_sent() -> None:
    publisher = WeightPublisher(keep=1, chunk_bytes=1024, signing_key=None)
    publisher.publish({"w": torch.randn(64, 32), "b": torch.zeros(32)}, 1)
    held = publisher.get(1)
    messages = HeldMessages(held)
    assert len(messages) == len(held.bundle.chunks) > 1
    first, second = pb.WeightChunk.FromString(messages[0]), pb.WeightChunk.FromString(messages[1])
    assert first.HasField("manifest") and not second.HasField("manifest")
    assert first.data == bytes(held.bundle.chunks[0].data) and second.index == 1
    assert [pb.WeightChunk.FromString(r).index for r in messages[1:3]] == [1, 2]
