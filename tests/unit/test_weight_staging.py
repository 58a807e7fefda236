"""The host staging weights leave a device through: host tensors pass untouched (no bucket, no copy);
the GPU path, bucket by bucket through pinned memory, runs in the GPU check (tests marked `gpu`)."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.transport.weights.codec import decode_bundle, encode_state_dict
from decentralized_verl.transport.weights.staging import HostStaging


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
