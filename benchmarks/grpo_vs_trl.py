"""GRPO step time, our runtime vs TRL's GRPOTrainer: same machine, model, batch and reward, alternating runs.

    python benchmarks/grpo_vs_trl.py --model smollm2 --repeats 3        # SmolLM2-135M-Instruct, bf16
    python benchmarks/grpo_vs_trl.py --model tiny-llama --repeats 3     # 3.46 M-parameter Llama from config
    python benchmarks/grpo_vs_trl.py --tiny                             # smoke sizes (the test suite)
    python benchmarks/grpo_vs_trl.py --model smollm2 --shots 3          # 3 demos: prompts ~5x completions

A step = generate 64 completions (8 prompts x 8 samples, 32 new tokens, temperature 1), score them with
the `boxed` reward of examples/smollm2-arithmetic-grpo.yaml, GRPO advantages, one optimizer step with
gradient accumulation over micro-batches of 16 completions. Our side is the runtime's Coordinator with
every role colocated (what `dverl run` builds for `replicas: 0`); TRL's side is GRPOTrainer on a copy of
the same model object. Each repeat runs both sides (order alternates between repeats, so load drift on a
shared machine hits both), each run discards `--warmup` steps and times `--steps` more. Reported: median
step time per side, the ratio TRL / ours, and where the time goes (generation, reward, extra log-prob
passes, learner forward, backward, optimizer, weight sync, other/idle). TRL variants: `matched` (gradient
checkpointing off, like ours) and `default` (TRL's default, gradient checkpointing on); every setting of
both sides is in the JSON report. The target is 2.5x, and 3x where the prompts (median tokens) are longer
than the completions, since that is where one prompt pass per group saves the most.
Prints one JSON object on stdout; progress and the tables on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import _common as c
from _ours import OursGRPO
from _trl import TRL_VARIANTS, TRLGRPO, TRLVariant

TARGET_RATIO = 2.5
LONG_PROMPT_TARGET_RATIO = 3.0
"""Where prompts are longer than completions the shared-prompt forward is meant to widen the gap."""


def target_ratio(prompt_tokens: float, new_tokens: int) -> float:
    return LONG_PROMPT_TARGET_RATIO if prompt_tokens > new_tokens else TARGET_RATIO


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_ours(
    base: Any,
    tokenizer: Any,
    prompts,
    settings: c.GRPOSettings,
    dtype: str,
    warmup: int,
    steps: int,
    microbatch_tokens: int | None = None,
):
    runner = OursGRPO(c.fresh_copy(base), tokenizer, prompts, settings, dtype, microbatch_tokens)
    try:
        records = [runner.step() for _ in range(warmup + steps)]
        return records[warmup:], runner.settings_used()
    finally:
        runner.close()
        c.release(runner)


def run_trl(
    base: Any,
    tokenizer: Any,
    prompts,
    settings: c.GRPOSettings,
    variant: TRLVariant,
    warmup: int,
    steps: int,
    attention: str = "sdpa",
):
    copy = c.fresh_copy(base)
    total = warmup + steps
    runner = TRLGRPO(copy, tokenizer, prompts, settings, variant, max_steps=total, attention=attention)
    records: list[dict[str, Any]] = []

    def on_step(info: dict[str, Any]) -> bool:
        records.append(info)
        return len(records) >= warmup + steps

    try:
        runner.run(on_step)
        return records[warmup:], runner.settings_used()
    finally:
        runner.close()
        c.release(runner)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in records]
    phases = sorted({k for r in records for k in r["profile"]})
    return {
        "median_step_s": c.median(walls),
        "steps_s": walls,
        "profile_median_s": {k: c.median([r["profile"].get(k, 0.0) for r in records]) for k in phases},
    }


PHASE_ORDER = (
    "generation",
    "reward",
    "logprobs_extra",
    "forward_loss",
    "backward",
    "optimizer",
    "backward_optimizer",
    "sync",
    "other_idle",
)


def profile_rows(sides: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    present = {k for side in sides.values() for k in side["profile_median_s"]}
    phases = [k for k in PHASE_ORDER if k in present] + sorted(present - set(PHASE_ORDER))
    headers = ["side", "step (s)", *phases]
    rows = [
        [name, side["median_step_s"], *[side["profile_median_s"].get(k, 0.0) for k in phases]]
        for name, side in sides.items()
    ]
    return headers, rows


def benchmark_model(args: argparse.Namespace, name: str, settings: c.GRPOSettings) -> dict[str, Any]:
    dtype = c.default_dtype(name) if args.dtype == "auto" else args.dtype
    base, tokenizer, load_s = c.load_model(name, dtype)
    prompts = c.arithmetic_prompts(tokenizer, shots=args.shots)
    prompt_tokens = c.median([len(p.token_ids) for p in prompts])
    target = target_ratio(prompt_tokens, settings.max_new_tokens)
    log(f"[{name}] prompts: median {prompt_tokens:.0f} tokens ({args.shots} demo(s)); target >= {target}x")
    variants = [] if args.skip_trl_reason else list(args.trl_variants)
    sides = ["ours", *[f"trl-{v}" for v in variants]]
    records: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    per_repeat: dict[str, list[float]] = {s: [] for s in sides}
    used: dict[str, Any] = {}
    loads: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            began = time.perf_counter()
            if side == "ours":
                got, used[side] = run_ours(
                    base,
                    tokenizer,
                    prompts,
                    settings,
                    dtype,
                    args.warmup,
                    args.steps,
                    args.ours_microbatch_tokens,
                )
            else:
                variant = side.removeprefix("trl-")
                got, used[side] = run_trl(
                    base,
                    tokenizer,
                    prompts,
                    settings,
                    TRL_VARIANTS[variant],
                    args.warmup,
                    args.steps,
                    args.trl_attention,
                )
            records[side] += got
            loads.append({"repeat": repeat, "side": side, "load_1m_after": c.load_average()})
            per_repeat[side].append(c.median([r["wall_s"] for r in got]))
            log(
                f"[{name}] repeat {repeat + 1}/{args.repeats} {side}: steps "
                f"{[round(r['wall_s'], 2) for r in got]} s (run {time.perf_counter() - began:.1f} s)"
            )
    summary = {side: summarize(records[side]) | {"per_repeat_median_s": per_repeat[side]} for side in sides}
    for side in sides:
        summary[side]["settings"] = used.get(side)
    ours = summary["ours"]["median_step_s"]
    ratios = {}
    for side in sides[1:]:
        paired = [t / o for t, o in zip(per_repeat[side], per_repeat["ours"], strict=True)]
        ratios[side] = {
            "ratio_of_medians": summary[side]["median_step_s"] / ours,
            "per_repeat": paired,
            "median_per_repeat": c.median(paired),
            "target": target,
            "target_met": summary[side]["median_step_s"] / ours >= target,
        }
    headers, rows = profile_rows(summary)
    table = c.markdown_table(headers, rows)
    ratio_table = c.markdown_table(
        ["TRL variant", "TRL median step (s)", "ours median step (s)", "TRL / ours", "per repeat"],
        [
            [
                side,
                summary[side]["median_step_s"],
                ours,
                r["ratio_of_medians"],
                ", ".join(f"{x:.2f}" for x in r["per_repeat"]),
            ]
            for side, r in ratios.items()
        ],
    )
    log(f"\n[{name}] ratio (target >= {target}x)\n{ratio_table}\n")
    log(f"[{name}] where the time goes, median s per step\n{table}\n")
    return {
        "dtype": dtype,
        "parameters": c.count_parameters(base),
        "prompt_tokens_median": prompt_tokens,
        "shots": args.shots,
        "load_average_per_run": loads,
        "load_s": load_s,
        "sides": summary,
        "ratios": ratios,
        "trl_skipped": args.skip_trl_reason,
        "markdown": {"ratio": ratio_table, "profile": table},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2"], choices=sorted(c.MODELS))
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="model weights on both sides (auto: bfloat16 for smollm2, float32 for the tiny models)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (each runs every side)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--shots", type=int, default=1, help="demos in each prompt (more: longer prompts, same task)"
    )
    parser.add_argument("--microbatch-prompts", type=int, default=2)
    parser.add_argument(
        "--ours-microbatch-tokens",
        type=int,
        default=None,
        help="pack our micro-batches by this token budget (training.microbatchTokens) instead of "
        "--microbatch-prompts rows; e.g. TRL's micro-batch positions, for equal activation memory",
    )
    variants = list(TRL_VARIANTS)
    parser.add_argument("--trl-variants", nargs="+", default=variants, choices=variants)
    parser.add_argument("--skip-trl", action="store_true", help="time our side only")
    parser.add_argument(
        "--trl-attention",
        choices=("sdpa", "same"),
        default="sdpa",
        help="TRL's model attention: sdpa (as from_pretrained gives it) or the same as ours",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument(
        "--tiny", action="store_true", help="smoke: tiny model, 2 prompts x 4 samples x 8 tokens, 1 step"
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.model, args.repeats, args.steps, args.warmup = ["tiny-smoke"], 1, 1, 0
        args.prompts, args.samples, args.new_tokens, args.microbatch_prompts = 2, 4, 8, 1
    c.check_batch_args(
        parser, args, ("repeats", "steps", "prompts", "samples", "new_tokens", "microbatch_prompts", "shots")
    )
    if args.warmup < 0:
        parser.error(f"--warmup: must be >= 0 (got {args.warmup})")
    if args.ours_microbatch_tokens is not None and args.ours_microbatch_tokens < 1:
        parser.error(f"--ours-microbatch-tokens: must be >= 1 (got {args.ours_microbatch_tokens})")
    args.skip_trl_reason = "--skip-trl given" if args.skip_trl else c.trl_missing_reason()
    if args.skip_trl_reason:
        log(f"TRL side skipped: {args.skip_trl_reason}")
    threads = c.set_threads(args.threads)
    settings = c.grpo_settings(args)
    report: dict[str, Any] = {
        **c.report_header("grpo_vs_trl", argv, threads, settings),
        "repeats": args.repeats,
        "timed_steps_per_run": args.steps,
        "warmup_steps_per_run": args.warmup,
        "models": {},
    }
    for name in args.model:
        report["models"][name] = benchmark_model(args, name, settings)
    c.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
