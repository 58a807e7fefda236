"""The planner's numbers against real training: the activation count against the tensors autograd saves
(tiny models, each case of the count), and the learner estimate against the peak resident memory a real
policy update adds (a 56M-parameter Llama, in a subprocess).

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import sys

import pytest
import torch

from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.planning.memory import MicroBatch, Trainable, saved_activation_bytes
from decentralized_verl.planning.shapes import shape_from_config
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))


VOCAB = 300
ALL_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model(dtype: torch.dtype, kv_heads: int, lora: tuple[int, tuple[str, ...]] | None):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora[0], lora_alpha=16, target_modules=list(lora[1])))
    return model, shape_from_config(config.to_dict())


def _batch(prompts: int, group: int, prompt_tokens: int, response_tokens: int):
    """Left-padded prompts of different lengths (the longest `prompt_tokens`), responses up to
    `response_tokens`: the padding and masks a real batch has."""
    g = torch.Generator().manual_seed(1)
    samples = []
    for k in range(prompts):
        prompt = tuple(torch.randint(3, VOCAB, (prompt_tokens - k,), generator=g).tolist())
        for j in range(group):
            length = response_tokens - (j % 3)
            response = tuple(torch.randint(3, VOCAB, (length,), generator=g).tolist())
            logprobs = (0.0,) * length
            samples.append(Sample(Prompt(f"p{k}", k, prompt, ""), j, response, logprobs, "stop", "", 0))
    return collate(samples, 0)


def _saved_bytes(model, batch, plain: bool) -> int:
    """Bytes of the distinct tensors autograd saves for the backward (parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_logprobs(model, batch, plain=plain)
    return sum(seen.values())


@pytest.mark.parametrize(
    ("dtype", "kv_heads", "lora", "plain"),
    [
        (torch.float32, 4, None, False),
        (torch.float32, 2, None, False),
        (torch.bfloat16, 2, None, False),
        (torch.float32, 2, None, True),
        (torch.float32, 2, (8, ("q_proj", "v_proj")), False),
        (torch.bfloat16, 2, (4, ALL_LINEARS), False),
    ],
    ids=["fp32", "fp32-gqa", "bf16-gqa", "fp32-plain", "fp32-lora-qv", "bf16-lora-all"],
)
def test_activation_count_matches_what_autograd_saves(dtype, kv_heads, lora, plain) -> None:
    model, shape = _model(dtype, kv_heads, lora)
    prompts, group, p, r = 2, 4, 20, 12
    batch = _batch(prompts, group, p, r)
    saved = _saved_bytes(model, batch, plain)
    # The log-softmax output is the planner's `logits` component, counted apart.
    saved -= int(batch.response_mask.sum()) * VOCAB * 4
    b = 4 if dtype == torch.float32 else 2
    micro = MicroBatch(prompts, prompts * group, p, r, shared_prompt=not plain)
    trainable = Trainable(lora[0], lora[1]) if lora else Trainable()
    estimated = saved_activation_bytes(shape, b, micro, trainable)
    # The estimate is at the longest prompt and response; the batch has shorter ones too.
    assert saved <= estimated <= 1.06 * saved, (estimated, saved)
