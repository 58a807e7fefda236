"""The learner's forward+backward on one GRPO batch: the model's own call over the padded batch (plain)
vs `core.forward` (each prompt once, logits only at response tokens), same weights, same batch.

    python benchmarks/shared_prompt_forward.py                              # SmolLM2-135M shape, fp32, CPU
    python benchmarks/shared_prompt_forward.py --device cuda --dtype bfloat16 --prompt-tokens 75 300 1000
    python benchmarks/shared_prompt_forward.py --smoke                      # a tiny shape: the test suite

The model is a Llama built from SmolLM2-135M's configuration (30 layers, 576 hidden, 9 heads / 3 KV heads,
49,152 vocabulary, tied embeddings) with random weights: the cost of a forward does not depend on the
values. Batch: `--prompts` groups of `--samples` rows; prompt lengths spread +-20% around each
`--prompt-tokens` (left padding differs per group), responses uniform in [R/2, R]. Loss: the mean token
log-prob (what a policy loss reduces to for timing). Reported per prompt length: median seconds of
forward+backward over `--repeats` (after a warm-up) for each path, the ratio, token positions computed,
and how far the shared path's log-probs and gradients are from the plain path's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SMOLLM2 = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    max_position_embeddings=8192,
)  # fmt: skip
SMOKE = dict(
    vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=512,
)  # fmt: skip


def build(config: dict, dtype, device):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**config, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).train()


def batch_for(args, prompt_tokens: int, vocab: int, device):
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    g = torch.Generator().manual_seed(prompt_tokens)
    samples = []
    for group in range(args.prompts):
        n = max(2, int(prompt_tokens * (0.8 + 0.4 * torch.rand(1, generator=g).item())))
        prompt = tuple(torch.randint(1, vocab, (n,), generator=g).tolist())
        for k in range(args.samples):
            r = int(
                torch.randint(max(1, args.response_tokens // 2), args.response_tokens + 1, (1,), generator=g)
            )
            response = tuple(torch.randint(1, vocab, (r,), generator=g).tolist())
            samples.append(
                Sample(Prompt(f"p{group}", group, prompt, ""), k, response, (0.0,) * r, "stop", "", 0)
            )
    batch = collate(samples, 0)
    for name, value in vars(batch).items():
        if hasattr(value, "to"):
            setattr(batch, name, value.to(device))
    return batch


def timed(fn, device: str) -> float:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def measure(args, model, prompt_tokens: int) -> dict:
    import torch

    from decentralized_verl.core.forward import positions_computed, response_logprobs

    batch = batch_for(args, prompt_tokens, model.config.vocab_size, args.device)
    mask = batch.response_mask

    def step(plain: bool) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, batch, plain=plain)
        ((logp * mask).sum() / mask.sum()).backward()
        return logp.detach()

    out: dict = {"prompt_tokens": prompt_tokens, "rows": batch.size}
    results = {}
    for plain in (True, False):
        name = "plain" if plain else "shared"
        results[name] = step(plain)  # warm-up, and the values compared below
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        results[f"{name}_grad"] = grads
        times = [timed(lambda plain=plain: step(plain), args.device) for _ in range(args.repeats)]
        out[f"{name}_s"] = times
        out[f"{name}_median_s"] = statistics.median(times)
    out["speedup"] = out["plain_median_s"] / out["shared_median_s"]
    out["positions_plain"] = int(batch.input_ids.numel())
    out["positions_shared"] = positions_computed(batch)
    out["max_abs_logprob_diff"] = float((results["plain"] - results["shared"]).abs().max())
    g0, g1 = results["plain_grad"], results["shared_grad"]
    out["grad_rel_diff"] = float((g0 - g1).norm() / g0.norm())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[75])
    parser.add_argument("--response-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if min(args.prompt_tokens) < 2 or args.response_tokens < 1 or args.repeats < 1 or args.samples < 1:
        parser.error("--prompt-tokens >= 2, --response-tokens, --repeats and --samples >= 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    config = SMOKE if args.smoke else SMOLLM2
    if args.smoke:
        args.prompts, args.samples, args.prompt_tokens, args.response_tokens, args.repeats = 2, 4, [12], 6, 1
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = build(config, dtype, args.device)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu x{torch.get_num_threads()}"
    report = {"device": device_name, "dtype": args.dtype, "config": "smoke" if args.smoke else "SmolLM2-135M"}
    report["runs"] = []
    for p in args.prompt_tokens:
        result = measure(args, model, p)
        report["runs"].append(result)
        print(
            f"prompt ~{p} tok, {result['rows']} rows: plain {result['plain_median_s']:.3f} s, shared "
            f"{result['shared_median_s']:.3f} s ({result['speedup']:.2f}x); positions "
            f"{result['positions_plain']} -> {result['positions_shared']}; max |dlogp| "
            f"{result['max_abs_logprob_diff']:.2e}, grad rel diff {result['grad_rel_diff']:.2e}",
            file=sys.stderr,
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
