"""Streamed encoding: weights that arrive one tensor at a time decode to the same tensors as a whole state
dict, the bundle verifies through the receivers' assembler, and a stream that breaks its layout is refused
by name while still being drained (other ranks of a collective gather wait on it)."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.core.streamed_weights import StreamedWeights, TensorSlot
from decentralized_verl.transport.weights.codec import WeightAssembler, decode_bundle
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.stream import encode_stream


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(37, 8, generator=gen),
        "layers.0.w": torch.randn(8, 8, generator=gen).to(torch.bfloat16),
        "layers.0.count": torch.arange(5, dtype=torch.int64),
        "flag": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
    }


def _streamed(state: dict[str, torch.Tensor], aliases: dict[str, str] | None = None) -> StreamedWeights:
    slots = tuple(TensorSlot(n, tuple(t.shape), t.dtype) for n, t in state.items())
    return StreamedWeights(slots, iter(list(state.items())), aliases or {})


@pytest.mark.parametrize("wire", [None, "bfloat16", "float32"])
@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
def test_streamed_bundle_decodes_to_the_same_tensors(wire: str | None, chunk_bytes: int) -> None:
    state = _state()
    bundle = encode_stream(
        _streamed(state, {"head.weight": "embed.weight"}), 3, dtype=wire, chunk_bytes=chunk_bytes
    )
    assembler = WeightAssembler(bundle.header)
    for chunk in reversed(bundle.chunks):
        assembler.add(chunk)
    out = assembler.finish()
    assert set(out) == {*state, "head.weight"}
    assert out["head.weight"] is out["embed.weight"]
    for name, tensor in state.items():
        want = (
            tensor.to(torch.bfloat16 if wire == "bfloat16" else torch.float32)
            if (wire and tensor.is_floating_point())
            else tensor
        )
        assert out[name].dtype == want.dtype and torch.equal(out[name], want), name
    assert bundle.header.total_bytes == len(bundle.payload())
    assert all(len(c.data) == bundle.header.chunk_size(c.index) for c in bundle.chunks)


def test_publisher_takes_streamed_weights_and_signs_them() -> None:
    publisher = WeightPublisher(dtype=None, signing_key=b"k" * 32)
    manifest = publisher.publish(_streamed(_state()), 4)
    held = publisher.get(4)
    assert held is not None and manifest.version == 4 and manifest.signature
    assert torch.equal(decode_bundle(held.bundle)["embed.weight"], _state()["embed.weight"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("empty"), "ended before 'empty'"),
        (lambda s: s.update({"embed.weight": torch.zeros(2, 2)}), "weights['embed.weight']: expected"),
        (lambda s: s.update({"extra": torch.zeros(1)}), "weights['extra']: not in the layout"),
    ],
)
def test_a_stream_that_breaks_its_layout_is_refused_and_drained(mutate, message: str) -> None:
    state = _state()
    slots = tuple(TensorSlot(n, tuple(t.shape), t.dtype) for n, t in state.items())
    sent = dict(state)
    mutate(sent)
    items = iter(list(sent.items()))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        encode_stream(StreamedWeights(slots, items), 1, dtype=None)
    assert next(items, None) is None
