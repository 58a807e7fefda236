"""Grouped attention computes what SDPA computes: logits, gradients and cached decoding of small models."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from decentralized_verl.core.kv_cache import cache_keyword, returned_cache
from decentralized_verl.models.grouped_attention import (
    NAME,
    grouped_attention,
    register,
    use_grouped_attention,
)

torch.set_num_threads(1)

MODELS = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, {}),
    "mistral-sliding": (transformers.MistralForCausalLM, transformers.MistralConfig, {"sliding_window": 5}),
}


def pair(kind: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    cls, config_cls, extra = MODELS[kind]
    config = config_cls(
        vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=64, **extra,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    sdpa = cls(config).to(dtype)
    ours = copy.deepcopy(sdpa)
    assert use_grouped_attention(ours)
    assert ours.config._attn_implementation == NAME and sdpa.config._attn_implementation == "sdpa"
    return sdpa, ours


def left_padded(batch: int = 3, width: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (batch, width), generator=g)
    mask = torch.ones(batch, width, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, :1] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_and_gradients_equal_sdpa_with_left_padding(kind: str) -> None:
    sdpa, ours = pair(kind)
    ids, mask, positions = left_padded()
    real = mask.bool()
    outs = [m(input_ids=ids, attention_mask=mask, position_ids=positions).logits for m in (sdpa, ours)]
    torch.testing.assert_close(outs[1][real], outs[0][real], atol=1e-5, rtol=1e-5)
    for out in outs:
        out[real].logsumexp(-1).sum().backward()
    for (name, a), b in zip(sdpa.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert all(torch.isfinite(o).all() for o in outs)  # padded query rows attend to nothing, stay finite


def test_bf16_logits_stay_within_bf16_rounding_of_sdpa() -> None:
    sdpa, ours = pair("llama", torch.bfloat16)
    ids, mask, positions = left_padded()
    a, b = (
        m(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float() for m in (sdpa, ours)
    )
    assert (a - b)[mask.bool()].abs().max() < 0.05


def test_cached_decoding_matches_one_full_pass() -> None:
    _, ours = pair("llama")
    ids, mask, positions = left_padded(width=12)
    full = ours(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    prefix = ours(
        input_ids=ids[:, :9], attention_mask=mask[:, :9], position_ids=positions[:, :9], use_cache=True
    )
    cache, logits, keyword = returned_cache(prefix), None, cache_keyword(ours)
    for col in range(9, 12):
        step = ours(
            input_ids=ids[:, col : col + 1],
            attention_mask=mask[:, : col + 1],
            position_ids=positions[:, col : col + 1],
            use_cache=True,
            **{keyword: cache},
        )
        cache, logits = returned_cache(step), step.logits[:, -1]
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)


class _Module(torch.nn.Module):
    is_causal = True


def attention_inputs(batch=2, heads=6, kv_heads=2, q_len=3, k_len=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, 4, generator=g)
    k = torch.randn(batch, kv_heads, k_len, 4, generator=g)
    v = torch.randn(batch, kv_heads, k_len, 4, generator=g)
    return q, k, v


def reference(q, k, v, allowed: torch.Tensor) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return out.transpose(1, 2)


def test_no_mask_is_causal_with_queries_at_the_end_of_the_keys() -> None:
    q, k, v = attention_inputs()
    allowed = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)
    out, _ = grouped_attention(_Module(), q, k, v, None)
    torch.testing.assert_close(out, reference(q, k, v, allowed), atol=1e-6, rtol=1e-6)
    full, _ = grouped_attention(_Module(), q, k, v, None, is_causal=False)
    torch.testing.assert_close(
        full, reference(q, k, v, torch.ones(3, 5, dtype=torch.bool)), atol=1e-6, rtol=1e-6
    )


def test_boolean_and_per_head_masks() -> None:
    q, k, v = attention_inputs()
    allowed = torch.rand(2, 1, 3, 5, generator=torch.Generator().manual_seed(3)) > 0.3
    allowed[..., 0] = True
    out, _ = grouped_attention(_Module(), q, k, v, allowed)
    torch.testing.assert_close(out, reference(q, k, v, allowed), atol=1e-6, rtol=1e-6)
    per_head = allowed.expand(2, 6, 3, 5).clone()
    per_head[:, 4:, :, 1] = False
    additive = torch.zeros(per_head.shape).masked_fill(~per_head, torch.finfo(torch.float32).min)
    out, _ = grouped_attention(_Module(), q, k, v, additive)
    torch.testing.assert_close(out, reference(q, k, v, per_head), atol=1e-6, rtol=1e-6)


def test_calls_it_does_not_cover_go_to_sdpa() -> None:
    q, k, v = attention_inputs()
    register()
    with pytest.raises(ValueError, match="softcap"):  # SDPA's own refusal: the call reached it
        grouped_attention(_Module(), q, k, v, None, softcap=30.0)


def test_only_supported_cpu_models_switch() -> None:
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32)
    )
    assert not use_grouped_attention(gpt2)
    assert gpt2.config._attn_implementation != NAME
    gemma2 = transformers.Gemma2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    assert not use_grouped_attention(transformers.Gemma2ForCausalLM(gemma2))
