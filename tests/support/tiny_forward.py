"""Tiny Llamas, grouped samples, and the plain whole-sequence forward the learner's forward is checked by."""

from __future__ import annotations

import torch
import transformers

from decentralized_verl.core.samples import Prompt, Sample, TrainBatch

PAD = 0


def llama(seed: int, *, smollm_shaped: bool = False) -> transformers.LlamaForCausalLM:
    """A tiny Llama; `smollm_shaped` copies SmolLM2's layout (tied embeddings, 3:1 grouped-query heads,
    SiLU MLP of 8/3 width, rope theta 1e5) at a size a test can run."""
    if smollm_shaped:
        config = transformers.LlamaConfig(
            vocab_size=512, hidden_size=96, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=6, num_key_value_heads=2, rope_theta=100000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=True, max_position_embeddings=256, pad_token_id=PAD,
        )  # fmt: skip
    else:
        config = transformers.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, pad_token_id=PAD,
        )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).float()


def grouped_samples(vocab: int, group_sizes=(3, 1, 4), seed: int = 0) -> list[Sample]:
    """Groups with prompts of different lengths (so left padding differs) and responses of varied lengths."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for group, size in enumerate(group_sizes):
        prompt = tuple(torch.randint(1, vocab, (4 + 3 * group,), generator=g).tolist())
        for k in range(size):
            n = int(torch.randint(1, 9, (1,), generator=g))
            response = tuple(torch.randint(1, vocab, (n,), generator=g).tolist())
            samples.append(
                Sample(Prompt(f"p{group}", group, prompt, ""), k, response, (0.0,) * n, "stop", "", 0)
            )
    return samples


def plain_logprobs(model, batch: TrainBatch, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the whole padded sequence through the model, logits at every position."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.float()
    p, r = batch.prompt_length, batch.response_mask.shape[1]
    logits = logits[:, p - 1 : p - 1 + r] / temperature
    log_probs = torch.log_softmax(logits, -1)
    picked = log_probs.gather(-1, batch.input_ids[:, p : p + r, None]).squeeze(-1) * batch.response_mask
    entropy = -(log_probs.exp() * log_probs).sum(-1) * batch.response_mask
    return picked, entropy


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
