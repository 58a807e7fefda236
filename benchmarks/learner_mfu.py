"""Learner MFU: achieved FLOP/s of our policy update vs a bf16 (and fp32) matmul ceiling measured here.

    python benchmarks/learner_mfu.py                         # SmolLM2-135M (bf16) and the 3.46 M tiny Llama
    python benchmarks/learner_mfu.py --models smollm2 --repeats 5
    python benchmarks/learner_mfu.py --tiny                  # smoke sizes (the test suite)

The update is `PolicyTrainer.update` (GRPO loss, AdamW, grad clipping) on one GRPO step's batch: 64 rows
(8 prompts x 8 samples) of a real arithmetic prompt (left-padded) plus 32 response tokens, in micro-batches
of 16, exactly as the runtime trains. FLOPs counted two ways:
  - `6NT`: 6 x parameters x tokens (fwd 2NT + bwd 4NT), tokens = non-padding tokens of the batch; N counts
    every distinct parameter once (a tied embedding/lm_head counts once). The usual rule of thumb.
  - `model`: 6 x body parameters x tokens (embedding lookups cost no FLOPs) + 6 x vocab x hidden x rows x
    (R + 1) for the lm_head (the learner computes logits only for the response positions) + attention
    scores and mixing, 12 x layers x hidden x S^2 per row (fwd + bwd, full S x S, S = padded length).
The ceiling is the median GFLOP/s of square bf16 (and fp32) matmuls with the same torch thread count,
timed in this process right before the update. MFU = achieved / ceiling (of the model's dtype and bf16).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import _common as c
from _ours import _Timer, ours_spec


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def matmul_ceiling(size: int, dtype_name: str, repeats: int) -> dict[str, float]:
    """Median and best GFLOP/s of `size`^3 matmuls (2 size^3 FLOPs each), after one warm-up."""
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        began = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * size**3 / (time.perf_counter() - began) / 1e9)
    return {"size": size, "median_gflops": c.median(rates), "best_gflops": max(rates)}


def synthetic_batch(tokenizer: Any, settings: c.GRPOSettings, model: Any, seed: int = 0) -> Any:
    """One GRPO step's TrainBatch: real prompts, random response tokens and behaviour log-probs,
    binary rewards, advantages attached the way the coordinator does."""
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    generator = torch.Generator().manual_seed(seed)
    prompts = c.arithmetic_prompts(tokenizer, limit=settings.prompts_per_step)
    vocab = model.get_input_embeddings().num_embeddings
    samples = []
    for group, item in enumerate(prompts):
        prompt = Prompt(item.prompt_id, group, item.token_ids, item.text, item.answer)
        for k in range(settings.samples_per_prompt):
            ids = torch.randint(3, vocab, (settings.max_new_tokens,), generator=generator).tolist()
            logprobs = (-torch.rand(settings.max_new_tokens, generator=generator) * 5).tolist()
            samples.append(
                Sample(prompt, k, tuple(ids), tuple(logprobs), "length", "", 0, score=float(k % 2))
            )
    return collate(samples, tokenizer.pad_token_id)


def flop_counts(model: Any, batch: Any) -> dict[str, float]:
    config = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = c.count_parameters(model)
    tied = head is embed
    body = total - embed.numel() - (0 if tied else head.numel())
    rows, width = batch.input_ids.shape
    response = batch.response_mask.shape[1]
    tokens = int(batch.attention_mask.sum())
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_flops = 6 * head.shape[0] * hidden * rows * (response + 1)
    attention = 12 * layers * hidden * width * width * rows
    return {
        "parameters": total,
        "body_parameters": body,
        "tokens": tokens,
        "rows": rows,
        "padded_length": width,
        "flops_6nt": 6.0 * total * tokens,
        "flops_model": 6.0 * body * tokens + head_flops + attention,
    }


def shared_budget(args: argparse.Namespace, settings: c.GRPOSettings, batch: Any) -> int | None:
    """The shared side's micro-batch token budget: `--shared-microbatch-tokens`, where "plain" is the token
    positions one plain micro-batch of `batch` computes (its rows padded to the batch's longest), i.e. the
    same activation memory per micro-batch. The plain forward computes every row's prompt, so it cannot
    pack by the shared cost: it keeps `--microbatch-prompts`."""
    if args.shared_microbatch_tokens is None:
        return None
    if args.shared_microbatch_tokens != "plain":
        return int(args.shared_microbatch_tokens)
    rows = settings.microbatch_prompts * settings.samples_per_prompt
    return rows * int(batch.input_ids.shape[1])


def measure_model(
    args: argparse.Namespace, name: str, settings: c.GRPOSettings, *, plain: bool
) -> dict[str, Any]:
    import torch

    from decentralized_verl.runtime import compute_thread
    from decentralized_verl.training.advantage_step import attach_advantages
    from decentralized_verl.training.trainer import PolicyTrainer

    dtype = c.default_dtype(name) if args.dtype == "auto" else args.dtype
    torch.manual_seed(0)
    model, tokenizer, _ = c.load_model(name, dtype)
    if plain and args.plain_attention != "same":
        model.set_attn_implementation(args.plain_attention)  # the old path ran transformers' SDPA
    model.train()
    batch = synthetic_batch(tokenizer, settings, model)
    budget = None if plain else shared_budget(args, settings, batch)
    spec = ours_spec(settings, dtype, steps=args.repeats + 1, microbatch_tokens=budget)
    trainer = PolicyTrainer(model, spec)
    trainer.force_plain = plain
    timer = _Timer()
    trainer._loss = timer.wrap("forward", trainer._loss)
    timer.hook_optimizer(trainer.optimizer)
    attach_advantages(batch, trainer.settings)  # binary rewards -> non-zero GRPO advantages
    counts = flop_counts(model, batch)
    # Everything on the compute thread, as the runtime computes (one OpenMP team: compute_thread.py).
    ceilings = {
        d: compute_thread.call(matmul_ceiling, args.matmul_size, d, args.matmul_repeats)
        for d in ("bfloat16", "float32")
    }
    compute_thread.call(trainer.update, batch)  # warm-up: allocator, optimizer state
    timer.take()
    updates, fwd_bwd = [], []
    for _ in range(args.repeats):
        began = time.perf_counter()
        compute_thread.call(trainer.update, batch)
        wall = time.perf_counter() - began
        parts = timer.take()
        updates.append(wall)
        fwd_bwd.append(wall - parts.get("optimizer", 0.0))
    after = {
        d: compute_thread.call(matmul_ceiling, args.matmul_size, d, args.matmul_repeats)
        for d in ("bfloat16", "float32")
    }
    update_s, fwd_bwd_s = c.median(updates), c.median(fwd_bwd)
    out: dict[str, Any] = {
        "forward": "plain" if plain else "shared",
        "attention": model.config._attn_implementation,
        "microbatch_tokens": budget,
        "dtype": dtype,
        **counts,
        "tokens_per_s": counts["tokens"] / update_s,
        "update_s": updates,
        "median_update_s": update_s,
        "median_fwd_bwd_s": fwd_bwd_s,
        "ceiling_before": ceilings,
        "ceiling_after": after,
        "threads": torch.get_num_threads(),
    }
    for formula in ("6nt", "model"):
        flops = counts[f"flops_{formula}"]
        achieved = flops / update_s / 1e9
        out[f"achieved_gflops_{formula}"] = achieved
        out[f"achieved_fwd_bwd_gflops_{formula}"] = flops / fwd_bwd_s / 1e9
        for d in ("bfloat16", "float32"):
            ceiling = max(ceilings[d]["median_gflops"], after[d]["median_gflops"])
            out[f"mfu_{formula}_vs_{d}"] = achieved / ceiling
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "tiny-llama"], choices=sorted(c.MODELS))
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3, help="timed updates (after one warm-up)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--microbatch-prompts", type=int, default=2)
    parser.add_argument(
        "--shared-microbatch-tokens",
        default=None,
        help="pack the shared side's micro-batches by this token budget; 'plain': the positions one plain "
        "micro-batch computes (equal activation memory); default: --microbatch-prompts rows on both sides",
    )
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--matmul-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument(
        "--forward",
        default="both",
        choices=["both", "plain", "shared"],
        help="plain: the model's call over the padded batch (the old path); shared: a prompt pass per group",
    )
    parser.add_argument(
        "--plain-attention",
        choices=("sdpa", "same"),
        default="sdpa",
        help="the plain side's attention: sdpa (the old path) or the same as the shared side's",
    )
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument("--tiny", action="store_true", help="smoke: tiny model, 2 prompts x 4 x 8 tokens")
    args = parser.parse_args(argv)
    if args.tiny:
        args.models, args.repeats, args.matmul_size, args.matmul_repeats = ["tiny-smoke"], 2, 256, 3
        args.prompts, args.samples, args.new_tokens, args.microbatch_prompts = 2, 4, 8, 1
    c.check_batch_args(
        parser, args, ("repeats", "prompts", "samples", "new_tokens", "microbatch_prompts", "matmul_size")
    )
    budget = args.shared_microbatch_tokens
    if budget not in (None, "plain") and not (budget.isdigit() and int(budget) > 0):
        parser.error(f"--shared-microbatch-tokens: 'plain' or a token count > 0 (got {budget!r})")
    threads = c.set_threads(args.threads)
    settings = c.grpo_settings(args)
    report: dict[str, Any] = {
        **c.report_header("learner_mfu", argv, threads, settings),
        "models": {},
    }
    rows = []
    forwards = {"both": (True, False), "plain": (True,), "shared": (False,)}[args.forward]
    for name in args.models:
        report["models"][name] = {}
        for plain in forwards:
            result = measure_model(args, name, settings, plain=plain)
            report["models"][name][result["forward"]] = result
            dtype_ceiling = max(
                result[k][result["dtype"]]["median_gflops"] for k in ("ceiling_before", "ceiling_after")
            )
            ceiling = max(result[k]["bfloat16"]["median_gflops"] for k in ("ceiling_before", "ceiling_after"))
            spread = f"{min(result['update_s']):.2f}-{max(result['update_s']):.2f}"
            rows.append(
                [
                    name,
                    result["forward"],
                    f"{result['microbatch_tokens']} tokens"
                    if result["microbatch_tokens"]
                    else f"{settings.microbatch_prompts} prompts",
                    result["dtype"],
                    f"{result['parameters'] / 1e6:.2f} M",
                    result["tokens"],
                    f"{result['median_update_s']:.2f} ({spread})",
                    f"{result['tokens_per_s']:.0f}",
                    result["achieved_gflops_6nt"],
                    dtype_ceiling,
                    ceiling,
                    f"{100 * result['achieved_gflops_6nt'] / dtype_ceiling:.1f}%",
                    f"{100 * result['mfu_6nt_vs_bfloat16']:.1f}%",
                ]
            )
            log(
                f"{name} {result['forward']}: {result['median_update_s']:.2f} s/update, "
                f"{result['tokens_per_s']:.0f} tok/s"
            )
        if len(report["models"][name]) == 2:
            ratio = (
                report["models"][name]["shared"]["tokens_per_s"]
                / report["models"][name]["plain"]["tokens_per_s"]
            )
            report["models"][name]["speedup"] = ratio
            log(f"{name}: shared-prompt forward {ratio:.2f}x the plain forward's learner tokens/s")
    table = c.markdown_table(
        [
            "model",
            "forward",
            "micro-batches by",
            "dtype",
            "params",
            "tokens/update",
            "update s (min-max)",
            "learner tokens/s",
            "GFLOP/s (6NT, useful tokens)",
            "matmul ceiling of its dtype",
            "bf16 matmul ceiling",
            "MFU 6NT vs its dtype",
            "MFU 6NT vs bf16",
        ],
        rows,
    )
    report["markdown"] = table
    log("\n" + table + "\n")
    c.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
