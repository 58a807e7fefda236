"""Weight deltas: a version as the XOR of the previous one's bytes, zstd-compressed, checked against the
new version's signed manifest like a full bundle. Versions come from real optimizer steps on a real
(tiny) model; the reference is the full bundle encoded independently."""

from __future__ import annotations

import itertools

import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.weights.codec import WeightChunk, encode_state_dict
from decentralized_verl.transport.weights.delta import (
    apply_chain,
    apply_delta,
    changed_fraction,
    encode_delta,
    read_info,
)
from decentralized_verl.transport.weights.delta_publish import DeltaPublisher, NoDelta
from decentralized_verl.transport.weights.publish import Published, manifest_of
from decentralized_verl.transport.weights.receive import BundleBuilder
from tests.support.weight_states import trained_states

KEY = bytes(range(32))


def _bundles(states, dtype="bfloat16", first_version=0, chunk_bytes=4096):
    return [
        encode_state_dict(s, first_version + i, dtype=dtype, chunk_bytes=chunk_bytes)
        for i, s in enumerate(states)
    ]


def _verify(payload: bytes, bundle) -> Published:
    """Check a rebuilt payload against the target's manifest exactly as a receiver does."""
    manifest = manifest_of(bundle)
    builder = BundleBuilder(manifest, verify_key=None)
    size = manifest.chunk_bytes
    for i in range(0, len(payload), size):
        part = payload[i : i + size]
        builder.add_hashed(WeightChunk(manifest.version, i // size, part, digest_hex(part)))
    return builder.finish()


@pytest.mark.parametrize("first_version", [0, 8])  # 9 -> 10 changes the header's length
def test_a_delta_rebuilds_the_next_bundle_byte_for_byte(first_version: int) -> None:
    states = trained_states(lr=1e-3, steps=3)
    bundles = _bundles(states, first_version=first_version)
    for a, b in itertools.pairwise(bundles):
        frame = encode_delta(a.payload(), b.payload(), a.version, b.version)
        version, payload = apply_delta(a.payload(), frame, a.version)
        assert version == b.version and payload == b.payload()
        _verify(payload, b)
    frames = [
        encode_delta(a.payload(), b.payload(), a.version, b.version) for a, b in itertools.pairwise(bundles)
    ]
    version, payload = apply_chain(bundles[0].payload(), frames, bundles[0].version)
    assert version == bundles[-1].version and payload == bundles[-1].payload()


def test_small_steps_in_bf16_make_small_deltas_and_fp32_ones_do_not() -> None:
    states = trained_states(lr=1e-6, steps=1)
    bf16 = _bundles(states, "bfloat16")
    fp32 = _bundles(states, "float32")
    frame16 = encode_delta(bf16[0].payload(), bf16[1].payload(), 0, 1)
    frame32 = encode_delta(fp32[0].payload(), fp32[1].payload(), 0, 1)
    changed16 = changed_fraction(bf16[0].payload(), bf16[1].payload(), 2)
    changed32 = changed_fraction(fp32[0].payload(), fp32[1].payload(), 4)
    assert 0 < changed16 < 0.1 < changed32  # Adam moves every fp32 element; few cross a bf16 rounding edge
    assert len(frame16) * 10 < len(bf16[1].payload())
    assert len(frame32) > len(frame16) * 5
    same = encode_delta(bf16[1].payload(), bf16[1].payload().replace(b'"1"', b'"2"', 1), 1, 2)
    assert len(same) < 2000  # nothing changed but the version tag: almost nothing to send


def test_a_delta_against_the_wrong_base_is_refused_before_anything_is_held() -> None:
    bundles = _bundles(trained_states(lr=1e-3, steps=2))
    frame = encode_delta(bundles[1].payload(), bundles[2].payload(), 1, 2)
    with pytest.raises(WireError, match="against v1, this receiver holds v0"):
        apply_delta(bundles[0].payload(), frame, 0)
    # A receiver whose bytes are not really v1 (but claims to be) rebuilds garbage; the manifest says so.
    _, wrong = apply_delta(bundles[0].payload(), frame, 1)
    with pytest.raises(WireError, match="digest"):
        _verify(wrong, bundles[2])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: b"XXXX" + f[4:], "bad magic"),
        (lambda f: f[:4] + (10**6).to_bytes(4, "little") + f[8:], "out of range"),
        (lambda f: f[:8] + b"[" + f[9:], "malformed frame header"),
        (lambda f: f.replace(b"xor-zstd", b"xor-lzma"), "codec"),
        (lambda f: f[:-20], "decompress"),
        (lambda f: f[:-40] + bytes(40), "decompress"),
    ],
)
def test_damaged_frames_are_refused_naming_the_problem(damage, message: str) -> None:
    bundles = _bundles(trained_states(lr=1e-3, steps=1))
    frame = encode_delta(bundles[0].payload(), bundles[1].payload(), 0, 1)
    with pytest.raises(WireError, match=message):
        apply_delta(bundles[0].payload(), damage(frame), 0)


def test_deltas_only_join_versions_of_one_layout() -> None:
    states = trained_states(lr=1e-3, steps=1)
    bf16, fp32 = _bundles(states, "bfloat16"), _bundles(states, "float32", first_version=1)
    with pytest.raises(WireError, match="layouts differ"):
        encode_delta(bf16[0].payload(), fp32[0].payload(), 0, 1)
    with pytest.raises(WireError, match="not newer"):
        encode_delta(bf16[1].payload(), bf16[0].payload(), 1, 0)
    info, _ = read_info(encode_delta(bf16[0].payload(), bf16[1].payload(), 0, 1))
    assert (info.base, info.version) == (0, 1) and info.total_bytes == len(bf16[1].payload())


def test_the_publisher_keeps_a_chain_and_sends_full_bundles_past_it() -> None:
    states = trained_states(lr=1e-6, steps=5)
    publisher = DeltaPublisher(dtype="bfloat16", chunk_bytes=4096, keep=2, max_chain=3, signing_key=KEY)
    try:
        for version, state in enumerate(states):
            publisher.publish(state, version)
        assert publisher.versions == [4, 5]  # two full bundles held, never one per receiver
        held = publisher.get(5)
        base = encode_state_dict(
            states[3], 3, dtype="bfloat16", chunk_bytes=4096
        )  # what a receiver at v3 holds
        version, payload = apply_chain(base.payload(), publisher.chain(3, 5), 3)
        assert version == 5 and payload == held.bundle.payload()
        BundleBuilder(held.manifest, verify_key=None)  # the signed manifest the receiver checks against
        with pytest.raises(NoDelta, match="max chain 3"):
            publisher.chain(1, 5)
        with pytest.raises(NoDelta, match="not older"):
            publisher.chain(5, 5)
        with pytest.raises(NoDelta, match="not held"):
            publisher.chain(3, 9)
        publisher.publish(states[0], 7)  # a gap: nobody below v7 has a chain to it
        with pytest.raises(NoDelta, match="no delta chain"):
            publisher.chain(5, 7)
    finally:
        publisher.close()


def test_deltas_not_worth_sending_are_not_built_or_sent() -> None:
    states = trained_states(lr=1e-2, steps=2)
    fp32 = _bundles(states, "float32")
    with pytest.raises(WireError, match="of the bytes changed: not worth a delta"):
        encode_delta(fp32[0].payload(), fp32[1].payload(), 0, 1, max_changed=0.5)
    publisher = DeltaPublisher(dtype="float32", chunk_bytes=4096, max_fraction=0.5, signing_key=None)
    try:
        for version, state in enumerate(states):
            publisher.publish(state, version)
        with pytest.raises(NoDelta, match="too much did"):  # never built: every fp32 element moved
            publisher.chain(1, 2)
    finally:
        publisher.close()
    publisher = DeltaPublisher(dtype="bfloat16", chunk_bytes=4096, max_fraction=0.99, signing_key=None)
    try:
        for version, state in enumerate(states):
            publisher.publish(state, version)
        assert publisher.chain(1, 2)
        publisher.max_fraction = 0.001  # read when a receiver asks: now no chain is small enough
        with pytest.raises(NoDelta, match="not much smaller"):
            publisher.chain(1, 2)
    finally:
        publisher.close()


def test_bad_publisher_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="keep"):
        DeltaPublisher(keep=1)
    with pytest.raises(ValueError, match="max_chain"):
        DeltaPublisher(max_chain=0)
    with pytest.raises(ValueError, match="max_fraction"):
        DeltaPublisher(max_fraction=0)
