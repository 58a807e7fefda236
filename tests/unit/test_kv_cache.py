"""The preallocated decode cache holds exactly what transformers' growing DynamicLayer holds."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicLayer

from decentralized_verl.core.kv_cache import (
    PreallocatedLayer,
    cache_keyword,
    decode_cache,
    returned_cache,
)


def test_updates_and_row_drops_match_the_growing_layer() -> None:
    g = torch.Generator().manual_seed(0)
    ours, ref = PreallocatedLayer(capacity=9), DynamicLayer()
    prefill = torch.randn(4, 2, 5, 3, generator=g), torch.randn(4, 2, 5, 3, generator=g)
    for layer in (ours, ref):
        layer.update(*prefill)
    for step in range(4):
        new = (
            torch.randn(ours.keys.shape[0], 2, 1, 3, generator=g),
            torch.randn(ours.keys.shape[0], 2, 1, 3, generator=g),
        )
        got, want = ours.update(*new), ref.update(*new)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == ref.get_seq_length() == 6 + step
        assert ours.get_mask_sizes(1) == ref.get_mask_sizes(1)
        if step == 1:
            keep = torch.tensor([0, 2, 3])
            ours.batch_select_indices(keep)
            ref.batch_select_indices(keep)
    assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    assert ours.keys.shape == (3, 2, 9, 3)


def test_writing_past_the_capacity_is_an_error_and_capacity_must_be_positive() -> None:
    layer = PreallocatedLayer(capacity=3)
    layer.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(ValueError, match="4 positions written into a layer sized for 3"):
        layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="capacity: must be >= 1"):
        PreallocatedLayer(capacity=0)


def test_reset_empties_the_layer() -> None:
    layer = PreallocatedLayer(capacity=4)
    layer.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    layer.reset()
    assert layer.get_seq_length() == 0
    layer.update(torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2))
    assert layer.keys.shape == (2, 1, 1, 2)


def test_only_full_attention_layers_are_preallocated() -> None:
    llama = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4)
    assert [type(layer) for layer in decode_cache(llama, 16).layers] == [PreallocatedLayer] * 3
    mistral = transformers.MistralConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, sliding_window=8
    )
    kinds = {type(layer).__name__ for layer in decode_cache(mistral, 16).layers}
    assert kinds and PreallocatedLayer.__name__ not in kinds  # the sliding-window layers stay as they were


def test_the_cache_goes_under_the_name_the_model_takes() -> None:
    class Old:
        def forward(self, input_ids, past_key_values=None): ...

    class New:
        def forward(self, input_ids, cache=None): ...

    assert cache_keyword(Old()) == "past_key_values" and cache_keyword(New()) == "cache"

    class Output:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    assert returned_cache(Output(cache="c")) == "c"
    assert returned_cache(Output(past_key_values="p")) == "p"
    assert returned_cache(Output()) is None
