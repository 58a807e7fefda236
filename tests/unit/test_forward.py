"""The learner's forward (shared prompt per group, logits only at response tokens, trimmed padding) gives
the log-probs, entropies, critic values and gradients of a plain full-sequence forward.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import copy

import pytest
import torch

from decentralized_verl.core.forward import (
    positions_computed,
    response_logprobs,
    response_values,
    shared_prompts,
)
from decentralized_verl.core.samples import Prompt, TrainBatch, collate
from decentralized_verl.training.value_model import ValueModel
from tests.support.tiny_forward import PAD, grads, grouped_samples, llama, plain_logprobs


def decoder_calls(model) -> list[tuple[int, int]]:
    """(rows, columns) of every decoder call on `model`, recorded as they happen."""
    calls: list[tuple[int, int]] = []
    model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    return calls


def check_equal(model, batch: TrainBatch, *, temperature: float = 1.0, atol: float = 1e-5) -> None:
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    want, want_entropy = plain_logprobs(a, batch, temperature)
    calls = decoder_calls(b)
    got, got_entropy = response_logprobs(b, batch, temperature, entropy=True)
    plan = shared_prompts(batch.input_ids[:, : batch.prompt_length])
    rows = batch.size
    assert calls[0][0] == (rows if plan is None else len(plan[0]))  # one prompt pass per distinct prompt
    assert len(calls) == (1 if plan is None or batch.response_lengths.max() == 1 else 2)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    assert torch.allclose(got_entropy, want_entropy, atol=atol)
    weights = torch.linspace(-1, 1, want.numel()).view_as(want)
    ((want * weights).sum() + want_entropy.sum() * 0.1).backward()
    ((got * weights).sum() + got_entropy.sum() * 0.1).backward()
    ga, gb = grads(a), grads(b)
    assert ga.shape == gb.shape
    assert (ga - gb).norm() <= 1e-5 * ga.norm() + 1e-7, float((ga - gb).norm() / ga.norm())


@pytest.mark.parametrize("smollm_shaped", [False, True])
def test_shared_prompt_forward_equals_the_full_forward(smollm_shaped: bool) -> None:
    model = llama(0, smollm_shaped=smollm_shaped)
    batch = collate(grouped_samples(model.config.vocab_size), PAD)
    assert shared_prompts(batch.input_ids[:, : batch.prompt_length]) is not None
    check_equal(model, batch)
    check_equal(model, batch, temperature=0.7)


def test_micro_batch_slices_rows_in_any_order_and_extra_padding() -> None:
    model = llama(1)
    samples = grouped_samples(model.config.vocab_size, (2, 3, 2), seed=4)
    batch = collate(samples, PAD)
    part = batch.select(torch.tensor([6, 0, 3, 1]))  # two groups split, rows interleaved
    check_equal(model, part)
    wide = collate([*samples, samples[0].with_(prompt=Prompt("long", 9, tuple(range(1, 30)), ""))], PAD)
    check_equal(model, wide.select(torch.arange(7)))  # 20+ prompt columns that are padding in every row


def test_single_token_responses_and_no_repeated_prompt() -> None:
    model = llama(2)
    one = [s.with_(response_ids=s.response_ids[:1], logprobs=(0.0,)) for s in grouped_samples(96, (3, 2))]
    check_equal(model, collate(one, PAD))
    distinct = grouped_samples(96, (1, 1, 1))
    batch = collate(distinct, PAD)
    assert shared_prompts(batch.input_ids[:, : batch.prompt_length]) is None
    check_equal(model, batch)


def test_lora_model_trains_only_adapters_with_equal_gradients() -> None:
    from peft import LoraConfig, get_peft_model

    base = llama(3)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"])
    )
    with torch.no_grad():  # B != 0 so the adapters change the outputs and get gradients of their own
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    check_equal(model, collate(grouped_samples(96, (4, 2), seed=5), PAD))


def test_critic_values_equal_the_full_forward() -> None:
    lm = llama(4)
    critic = ValueModel.from_causal_lm(lm, init_std=0.5)
    batch = collate(grouped_samples(96, (3, 3, 1), seed=6), PAD)
    a, b = copy.deepcopy(critic), copy.deepcopy(critic)
    out = a.backbone(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).last_hidden_state
    p, r = batch.prompt_length, batch.response_mask.shape[1]
    want = a.value_head(out[:, p - 1 : p - 1 + r]).squeeze(-1) * batch.response_mask
    got = response_values(b.backbone, b.value_head, batch)
    assert torch.allclose(got, want, atol=1e-5)
    want.sum().backward()
    got.sum().backward()
    assert torch.allclose(grads(a), grads(b), atol=1e-5, rtol=1e-4)


def test_positions_computed_counts_each_prompt_once() -> None:
    samples = grouped_samples(96, (4, 4), seed=7)
    batch = collate(samples, PAD)
    prompts = sorted({len(s.prompt.token_ids) for s in samples})
    longest_response = max(len(s.response_ids) for s in samples)
    assert positions_computed(batch) == 2 * prompts[-1] + 8 * (longest_response - 1)
    single = collate([samples[0]], PAD)
    assert positions_computed(single) == len(samples[0].prompt.token_ids) + len(samples[0].response_ids)


def test_models_with_transformed_logits_take_the_plain_path() -> None:
    model = llama(5)
    model.config.logit_scale = 0.5  # e.g. Cohere: logits are scaled after the head
    batch = collate(grouped_samples(96, (2, 2)), PAD)
    got, _ = response_logprobs(model, batch)
    want, _ = plain_logprobs(model, batch)  # the plain reference ignores the scale too: same model call
    assert torch.allclose(got, want, atol=1e-5)


def test_forward_chooser_keeps_the_faster_path_on_a_gpu_and_shared_on_a_cpu() -> None:
    from decentralized_verl.core.forward import ForwardChooser

    cpu = ForwardChooser("cpu")
    assert cpu.plain_next() is False and cpu.choice is False
    gpu = ForwardChooser("cuda", trials=2)
    timings = {False: 3.0, True: 1.0}  # the plain call is faster per position here
    seen = []
    while gpu.choice is None:
        plain = gpu.plain_next()
        seen.append(plain)
        gpu.record(plain, timings[plain] * 100, 100)
    assert seen == [False, True, False, True] and gpu.choice is True
    gpu.record(False, 0.0, 100)  # decided: later timings change nothing
    assert gpu.plain_next() is True
    other = ForwardChooser("cuda", trials=1)
    other.record(False, 1.0, 1000)  # shared: 1 ms per position over a bigger micro-batch
    other.record(True, 1.0, 100)  # plain: 10 ms per position
    assert other.choice is False
