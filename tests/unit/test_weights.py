"""The weight-transfer codec: round trips, dtype rounding, and every way a chunk stream can go wrong."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from blake3 import blake3

from decentralized_verl.errors import WireError
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.weights.codec import (
    WeightAssembler,
    WeightChunk,
    bundle_digest,
    cast_like,
    decode_bundle,
    decode_state_dict,
    encode_state_dict,
)


def sample_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(50, 16, generator=gen),
        "layers.0.attn.q.weight": torch.randn(16, 16, generator=gen) * 1e-3,
        "layers.0.norm.weight": torch.rand(16, generator=gen) + 0.5,
        "layers.0.mlp.up.weight": torch.randn(32, 16, generator=gen).to(torch.float16),
        "steps": torch.tensor([7, 8, 9], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def assemble(bundle, chunks=None):
    assembler = WeightAssembler(bundle.header)
    for chunk in bundle.chunks if chunks is None else chunks:
        assembler.add(chunk)
    return assembler.finish()


def test_float32_round_trip_is_exact_and_keeps_every_dtype():
    sd = sample_state_dict()
    bundle = encode_state_dict(sd, version=4, dtype=None, chunk_bytes=512)
    assert bundle.version == 4 and bundle.header.num_chunks > 5
    assert all(len(c.data) == 512 for c in bundle.chunks[:-1]) and 0 < len(bundle.chunks[-1].data) <= 512
    # the bundle digest, worked out independently: BLAKE3 of each slice of the payload, digests joined
    payload = bundle.payload()
    slices = [payload[i : i + 512] for i in range(0, len(payload), 512)]
    assert [c.data for c in bundle.chunks] == slices
    joined = b"".join(blake3(piece).digest() for piece in slices)
    assert bundle.header.digest == digest_hex(joined)
    out = assemble(bundle)
    assert out.keys() == sd.keys()
    for name, tensor in sd.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def test_float32_wire_dtype_upcasts_half_tensors_exactly():
    sd = sample_state_dict()
    out = assemble(encode_state_dict(sd, version=0, dtype="float32", chunk_bytes=4096))
    assert out["layers.0.mlp.up.weight"].dtype == torch.float32
    assert torch.equal(out["layers.0.mlp.up.weight"].half(), sd["layers.0.mlp.up.weight"])
    assert out["steps"].dtype == torch.int64 and out["mask"].dtype == torch.bool


def test_bfloat16_rounds_like_a_cast_and_within_bf16_precision():
    sd = sample_state_dict()
    bundle16 = encode_state_dict(sd, version=1)  # bfloat16 is the default wire dtype
    assert bundle16.header.dtype == "bfloat16"
    big = {"w": torch.randn(4096)}
    size32 = encode_state_dict(big, version=1, dtype=None).header.total_bytes
    size16 = encode_state_dict(big, version=1).header.total_bytes
    assert size32 - size16 == 4096 * 2  # half the tensor bytes; the safetensors header barely changes
    out = assemble(bundle16)
    for name, tensor in sd.items():
        if tensor.is_floating_point():
            assert out[name].dtype == torch.bfloat16
            assert torch.equal(out[name], tensor.to(torch.bfloat16)), name  # round-to-nearest-even cast
            back = out[name].float()
            # bf16 keeps 8 significant bits (ulp = 2^-7 of the leading power of two): rounding to
            # nearest errs by at most half an ulp, 2^-8 relative
            assert torch.all((back - tensor.float()).abs() <= tensor.float().abs() * 2.0**-8), name
        else:
            assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)
    assert not torch.equal(out["embed.weight"].float(), sd["embed.weight"])  # it did round
    restored = cast_like(out, sd)
    assert restored["embed.weight"].dtype == torch.float32
    assert restored["layers.0.mlp.up.weight"].dtype == torch.float16


def test_hand_worked_bf16_rounding():
    x = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-9, -(2.0**-130)])
    out = assemble(encode_state_dict({"x": x}, version=0))["x"].float()
    # ties to even: 1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6; below half ulp rounds down; subnormals survive
    assert out.tolist() == [1.0, 1.0 + 2.0**-6, 1.0, -(2.0**-130)]


def test_chunks_in_any_order():
    sd = sample_state_dict()
    bundle = encode_state_dict(sd, version=2, dtype=None, chunk_bytes=300)
    chunks = list(bundle.chunks)
    random.Random(0).shuffle(chunks)
    assert [c.index for c in chunks] != sorted(c.index for c in chunks)
    out = assemble(bundle, chunks)
    assert all(torch.equal(out[k], v) for k, v in sd.items())


def test_corrupted_chunk_is_rejected_by_index_and_can_be_resent():
    bundle = encode_state_dict(sample_state_dict(), version=3, chunk_bytes=256)
    assembler = WeightAssembler(bundle.header)
    good = bundle.chunks[2]
    flipped = bytes([good.data[0] ^ 1]) + good.data[1:]
    with pytest.raises(WireError, match=r"weights\.chunk\[2\].*digest"):
        assembler.add(dataclasses.replace(good, data=flipped))
    with pytest.raises(WireError, match=r"weights\.chunk\[2\].*bytes"):
        assembler.add(dataclasses.replace(good, data=good.data[:-1]))
    assert 2 in assembler.missing
    for chunk in bundle.chunks:
        assembler.add(chunk)
    assert torch.equal(assembler.finish()["embed.weight"], sample_state_dict()["embed.weight"].bfloat16())


def test_consistent_but_forged_chunk_fails_the_bundle_hash():
    bundle = encode_state_dict(sample_state_dict(), version=3, dtype=None, chunk_bytes=256)
    last = bundle.chunks[-1]
    forged_data = bytes(len(last.data))
    forged = WeightChunk(last.version, last.index, forged_data, digest_hex(forged_data))
    with pytest.raises(WireError, match=r"weights\.digest"):
        assemble(bundle, [*bundle.chunks[:-1], forged])


def test_missing_duplicate_and_out_of_range_chunks():
    bundle = encode_state_dict(sample_state_dict(), version=5, chunk_bytes=256)
    n = bundle.header.num_chunks
    assembler = WeightAssembler(bundle.header)
    for chunk in bundle.chunks:
        if chunk.index not in (1, n - 1):
            assert assembler.add(chunk) is False
    assert assembler.missing == [1, n - 1] and not assembler.complete
    with pytest.raises(WireError, match=rf"missing chunk\(s\) \[1, {n - 1}\]"):
        assembler.finish()
    with pytest.raises(WireError, match=r"weights\.chunk\[0\].*twice"):
        assembler.add(bundle.chunks[0])
    for index in (n, -1):
        with pytest.raises(WireError, match=rf"weights\.chunk\[{index}\].*out of range"):
            assembler.add(dataclasses.replace(bundle.chunks[0], index=index))
    assembler.add(bundle.chunks[1])
    assert assembler.add(bundle.chunks[n - 1]) is True
    assert set(assembler.finish()) == set(sample_state_dict())


def test_version_mismatch_is_rejected():
    old = encode_state_dict(sample_state_dict(0), version=6, chunk_bytes=256)
    new = encode_state_dict(sample_state_dict(1), version=7, chunk_bytes=256)
    assembler = WeightAssembler(new.header)
    with pytest.raises(WireError, match=r"chunk\[0\].*version 6.*version 7"):
        assembler.add(old.chunks[0])
    # a payload tagged with another version than its header says is rejected when decoded
    with pytest.raises(WireError, match=r"weights\.version.*tagged version 6.*expected"):
        decode_state_dict(old.payload(), version=7)
    # a sender that relabels old chunks and header as the new version is caught by the payload's tag
    relabelled = WeightAssembler(dataclasses.replace(old.header, version=7))
    for chunk in old.chunks:
        relabelled.add(dataclasses.replace(chunk, version=7))
    with pytest.raises(WireError, match=r"weights\.version"):
        relabelled.finish()


def test_tied_weights_travel_once_and_come_back_tied():
    embed = torch.randn(40, 8)
    fused = torch.randn(24, 8)
    sd = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied: the same tensor
        "q.weight": fused[:8],  # views of one storage that are not the same view: cloned
        "k.weight": fused[8:16],
        "v.weight": fused[16:],
    }
    untied = {**sd, "lm_head.weight": embed.clone()}
    bundle = encode_state_dict(sd, version=0, dtype=None)
    assert bundle.header.total_bytes < encode_state_dict(untied, version=0, dtype=None).header.total_bytes
    out = assemble(bundle)
    assert out.keys() == sd.keys()
    assert out["lm_head.weight"] is out["model.embed_tokens.weight"]
    for name, tensor in sd.items():
        assert torch.equal(out[name], tensor), name
    restored = cast_like(out, {k: v.double() for k, v in sd.items()})
    assert restored["lm_head.weight"] is restored["model.embed_tokens.weight"]
    assert restored["lm_head.weight"].dtype == torch.float64


def test_bad_inputs_and_headers():
    with pytest.raises(ValueError, match="dtype"):
        encode_state_dict({"x": torch.zeros(2)}, version=0, dtype="int8")
    with pytest.raises(ValueError, match="chunk_bytes"):
        encode_state_dict({"x": torch.zeros(2)}, version=0, chunk_bytes=0)
    with pytest.raises(ValueError, match="version"):
        encode_state_dict({"x": torch.zeros(2)}, version=-1)
    with pytest.raises(TypeError, match=r"state_dict\['x'\]"):
        encode_state_dict({"x": [1.0]}, version=0)
    bundle = encode_state_dict({"x": torch.zeros(100)}, version=0, chunk_bytes=64)
    with pytest.raises(WireError, match=r"weights\.header"):
        WeightAssembler(dataclasses.replace(bundle.header, num_chunks=1))
    with pytest.raises(WireError, match=r"weights\.payload"):
        decode_state_dict(b"\x05\x00\x00\x00\x00\x00\x00\x00{{{{{")


def test_round_trip_into_the_hf_backend():
    """The codec's output, cast back, is what ``HFBackend.load_weights`` accepts (tied Llama)."""
    import transformers

    from decentralized_verl.backends.weight_copy import plan_weight_copy

    config = transformers.LlamaConfig(
        vocab_size=30,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    learner, rollout = transformers.LlamaForCausalLM(config), transformers.LlamaForCausalLM(config)
    bundle = encode_state_dict(learner.state_dict(), version=9, dtype=None, chunk_bytes=1000)
    received = cast_like(assemble(bundle), rollout.state_dict())
    with torch.no_grad():
        for target, source in plan_weight_copy(rollout, received):
            target.copy_(source)
    for name, tensor in learner.state_dict().items():
        assert torch.equal(rollout.state_dict()[name], tensor), name


def test_bundle_digest_hand_worked_and_bound_to_order():
    a, b = blake3(b"a").hexdigest(), blake3(b"b").hexdigest()
    want = blake3(blake3(b"a").digest() + blake3(b"b").digest()).hexdigest()
    assert bundle_digest([a, b]) == want
    assert bundle_digest([b, a]) != want and bundle_digest([a]) != want  # order and count matter
    assert bundle_digest([]) == blake3(b"").hexdigest()


def test_hashed_flag_skips_only_the_hash_and_decode_bundle_needs_no_assembler():
    bundle = encode_state_dict(sample_state_dict(), version=3, dtype=None, chunk_bytes=256)
    good = bundle.chunks[1]
    data = bytes([good.data[0] ^ 1]) + good.data[1:]
    # the caller hashed the (altered) bytes itself: they are not hashed again, and the bundle digest
    # over the chunk digests still catches the substitution at finish
    altered = dataclasses.replace(good, data=data, digest=digest_hex(data))
    assembler = WeightAssembler(bundle.header)
    for chunk in bundle.chunks:
        assembler.add(altered if chunk.index == 1 else chunk, hashed=True)
    with pytest.raises(WireError, match=r"weights\.digest"):
        assembler.finish()
    with pytest.raises(WireError, match=r"weights\.chunk\[1\].*bytes"):  # sizes are still checked
        WeightAssembler(bundle.header).add(dataclasses.replace(good, data=good.data[:-1]), hashed=True)
    out = decode_bundle(bundle)
    assert all(torch.equal(out[k], v) for k, v in sample_state_dict().items())
