"""Time to a target held-out accuracy on the shipped arithmetic task: ours vs TRL, several seeds a side.

    python benchmarks/time_to_accuracy.py --budget 600 --seeds 0 1 2     # SmolLM2-135M, 10 min a run
    python benchmarks/time_to_accuracy.py --budget 600 --target 0.35
    python benchmarks/time_to_accuracy.py --tiny                         # smoke: < 60 s (the test suite)

Both sides train from the same SmolLM2-135M-Instruct weights with the settings of
examples/smollm2-arithmetic-grpo.yaml: GRPO (Dr.GRPO: no std scaling), 8 prompts x 8 samples x 32 tokens,
micro-batches of 2 prompts, lr 2e-5, temperature 0.7, the one-shot \\boxed{} demo, two-digit sums
(two_digit_train.jsonl). Our side is the runtime's colocated Coordinator; TRL's is GRPOTrainer (gradient
checkpointing off, no autocast, loss bnpo, scale_rewards none). Every seed runs each side once
(alternating), each run gets `--budget` seconds of training time; every `--eval-every` steps the clock
stops and the same evaluator (greedy decoding, our HF backend, the `boxed` reward) scores the 240 held-out
sums. Accuracy = share answered exactly. The target, unless given, is the accuracy TRL's median seed ends
at; time to target = training seconds at the first evaluation that reaches it. Reported per side: median
time to target and final accuracy over seeds, with each seed's value. Writes `curves.jsonl` and
`curves.png` under --out-dir and one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
from _ours import OursGRPO
from _trl import TRL_VARIANTS, TRLGRPO


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def evaluate(model: Any, tokenizer: Any, prompts: list[c.PromptItem], max_new_tokens: int) -> float:
    """Greedy accuracy with the `boxed` reward (the runtime's own eval: temperature 0, full answers)."""
    import torch

    from decentralized_verl.backends.base import GenerationRequest, SamplingParams
    from decentralized_verl.backends.hf import HFBackend

    was_training = model.training
    backend = HFBackend(model, tokenizer, max_batch_size=64)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
    requests = [GenerationRequest(str(i), p.token_ids, params) for i, p in enumerate(prompts)]
    with torch.no_grad():
        outputs = list(backend.generate(requests))
    model.train(was_training)
    correct = sum(c.boxed_score(o.text, prompts[int(o.prompt_id)].answer) >= 1.0 for o in outputs)
    return correct / len(prompts)


class Recorder:
    """Training clock and accuracy curve of one side; evaluation time is kept off the clock."""

    def __init__(self, side: str, model: Any, tokenizer: Any, args: argparse.Namespace, eval_prompts) -> None:
        self.curve = c.Curve(side)
        self.model, self.tokenizer, self.args, self.eval_prompts = model, tokenizer, args, eval_prompts
        self.train_s = 0.0
        self.steps = 0
        self.step_times: list[float] = []

    def point(self, accuracy: float, reward_mean: float | None, eval_s: float) -> None:
        self.curve.points.append(
            {
                "side": self.curve.side,
                "step": self.steps,
                "train_s": self.train_s,
                "accuracy": accuracy,
                "reward_mean": reward_mean,
                "eval_s": eval_s,
            }
        )
        log(f"  {self.curve.side}: step {self.steps} train {self.train_s:.1f} s accuracy {accuracy:.3f}")

    def after_step(self, wall_s: float, reward_mean: float | None) -> bool:
        """Count a step; evaluate when due; True when the budget is spent (after a final evaluation)."""
        self.steps += 1
        self.train_s += wall_s
        self.step_times.append(wall_s)
        done = self.train_s >= self.args.budget
        if done or self.steps % self.args.eval_every == 0:
            began = time.perf_counter()
            accuracy = evaluate(self.model, self.tokenizer, self.eval_prompts, self.args.new_tokens)
            self.point(accuracy, reward_mean, time.perf_counter() - began)
        return done


def run_ours(args, base, tokenizer, prompts, eval_prompts, settings, dtype, start_point) -> Recorder:
    model = c.fresh_copy(base)
    runner = OursGRPO(model, tokenizer, prompts, settings, dtype)
    recorder = Recorder("ours", model, tokenizer, args, eval_prompts)
    recorder.curve.points.append({**start_point, "side": "ours"})
    try:
        while True:
            record = runner.step()
            if recorder.after_step(record["wall_s"], record["reward_mean"]):
                break
    finally:
        runner.close()
    return recorder


def run_trl(args, base, tokenizer, prompts, eval_prompts, settings, start_point) -> Recorder:
    model = c.fresh_copy(base)
    runner = TRLGRPO(model, tokenizer, prompts, settings, TRL_VARIANTS["matched"])
    recorder = Recorder("trl", runner.model, tokenizer, args, eval_prompts)
    recorder.curve.points.append({**start_point, "side": "trl"})
    try:
        runner.run(lambda info: recorder.after_step(info["wall_s"], info["reward_mean"]))
    finally:
        runner.close()
    return recorder


def plot(curves: list[c.Curve], target: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"ours": "tab:blue", "trl": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    labelled: set[str] = set()
    for curve in curves:
        side = curve.side.split("/")[0]
        ax.plot(
            [p["train_s"] for p in curve.points],
            [p["accuracy"] for p in curve.points],
            "o-",
            color=colours.get(side),
            alpha=0.8,
            markersize=3,
            label=None if side in labelled else side,
        )
        labelled.add(side)
    ax.axhline(target, color="grey", linestyle="--", label=f"target {target:.3f}")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def first_reach(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation at or above the target (None: never)."""
    return next((p for p in points if p["accuracy"] >= target - 1e-9), None)


def side_summary(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Median (and range) over seeds of the time to the target and of the final accuracy. A run that
    never reached the target counts as slower than any that did (the median can be "not reached")."""
    times = sorted(
        (hit["train_s"] if (hit := first_reach(r["curve"], target)) else float("inf")) for r in runs
    )
    finals = [r["final_accuracy"] for r in runs]
    median_time = c.median(times)
    return {
        "seeds": [r["seed"] for r in runs],
        "time_to_target_s": [None if t == float("inf") else t for t in times],
        "median_time_to_target_s": None if median_time == float("inf") else median_time,
        "reached": sum(t != float("inf") for t in times),
        "final_accuracy": finals,
        "median_final_accuracy": c.median(finals),
        "final_accuracy_range": [min(finals), max(finals)],
        "median_step_s": c.median([s for r in runs for s in r["step_times"]]),
        "steps": [r["steps"] for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(c.MODELS))
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds per side")
    parser.add_argument("--eval-every", type=int, default=2, help="steps between evaluations")
    parser.add_argument("--eval-limit", type=int, default=None, help="held-out prompts (default: all)")
    parser.add_argument("--train", default="two_digit_train", help="examples/data/arithmetic/NAME.jsonl")
    parser.add_argument("--eval", default="two_digit_eval", help="held-out set (240 two-digit sums)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run a side per seed")
    parser.add_argument("--target", type=float, default=None, help="accuracy to reach")
    parser.add_argument(
        "--target-gain",
        type=float,
        default=0.05,
        help="without --target and without a TRL side: start accuracy + this",
    )
    parser.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--microbatch-prompts", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (both sides)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out-dir", default="runs/time_to_accuracy", help="curves.jsonl, curves.png")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument("--tiny", action="store_true", help="smoke: tiny model, 4 s a side, < 60 s")
    args = parser.parse_args(argv)
    if args.tiny:
        args.model, args.budget, args.eval_every, args.eval_limit = "tiny-smoke", 4.0, 1, 4
        args.prompts, args.samples, args.new_tokens, args.microbatch_prompts = 2, 4, 8, 1
        args.train, args.eval, args.seeds = "small_train", "small_eval", [0]
    if args.budget <= 0:
        parser.error(f"--budget: must be > 0 (got {args.budget})")
    c.check_batch_args(parser, args, ("eval_every", "prompts", "samples", "new_tokens", "microbatch_prompts"))
    if args.target is not None and not 0 < args.target <= 1:
        parser.error(f"--target: must be in (0, 1] (got {args.target})")
    trl_skipped = c.trl_missing_reason() if "trl" in args.sides else None
    if trl_skipped:
        log(f"TRL side skipped: {trl_skipped}")
        args.sides = [s for s in args.sides if s != "trl"]
    threads = c.set_threads(args.threads)
    dtype = c.default_dtype(args.model) if args.dtype == "auto" else args.dtype
    settings = c.grpo_settings(
        args, learning_rate=args.learning_rate, temperature=args.temperature, norm_adv_by_std=False
    )
    base, tokenizer, _ = c.load_model(args.model, dtype)
    prompts = c.arithmetic_prompts(tokenizer, args.train)
    eval_prompts = c.arithmetic_prompts(tokenizer, args.eval, limit=args.eval_limit)
    began = time.perf_counter()
    start_accuracy = evaluate(base, tokenizer, eval_prompts, args.new_tokens)
    start_point = {"step": 0, "train_s": 0.0, "accuracy": start_accuracy, "reward_mean": None}
    start_point["eval_s"] = time.perf_counter() - began
    target = args.target if args.target is not None else min(1.0, start_accuracy + args.target_gain)
    log(f"start accuracy {start_accuracy:.3f}; target {target:.3f}; budget {args.budget:.0f} s a side")

    import torch

    from decentralized_verl.reporting.stats import wilson_interval

    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    curves: list[c.Curve] = []
    for seed in args.seeds:
        seeded = dataclasses.replace(settings, seed=seed)
        for side in args.sides:
            log(f"{side} seed {seed}: training")
            torch.manual_seed(seed)
            if side == "ours":
                recorder = run_ours(args, base, tokenizer, prompts, eval_prompts, seeded, dtype, start_point)
            else:
                recorder = run_trl(args, base, tokenizer, prompts, eval_prompts, seeded, start_point)
            recorder.curve.side = f"{side}/seed{seed}"
            curves.append(recorder.curve)
            runs[side].append(
                {
                    "seed": seed,
                    "steps": recorder.steps,
                    "train_s": recorder.train_s,
                    "step_times": recorder.step_times,
                    "final_accuracy": recorder.curve.points[-1]["accuracy"],
                    "curve": recorder.curve.points,
                }
            )

    if args.target is not None:
        target, target_from = args.target, "--target"
    elif runs.get("trl"):
        # The bar TRL sets: the accuracy its median seed ends at after the budget.
        target = c.median([r["final_accuracy"] for r in runs["trl"]])
        target_from = "median final accuracy of TRL's seeds"
    else:
        target, target_from = min(1.0, start_accuracy + args.target_gain), "start + --target-gain"
    log(f"target {target:.3f} ({target_from})")

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "curves.jsonl").open("w") as handle:
        for curve in curves:
            for point in curve.points:
                handle.write(json.dumps({**point, "side": curve.side}) + "\n")
    title = f"time to accuracy: {args.train} -> {args.eval} ({len(eval_prompts)} held out)"
    plot(curves, target, out_dir / "curves.png", title)

    sides = {side: side_summary(side_runs, target) for side, side_runs in runs.items()}
    rows = []
    for side, summary in sides.items():
        median_time = summary["median_time_to_target_s"]
        times = ", ".join("-" if t is None else f"{t:.0f}" for t in summary["time_to_target_s"])
        low, high = summary["final_accuracy_range"]
        rows.append(
            [
                side,
                len(summary["seeds"]),
                summary["median_step_s"],
                f"{median_time:.0f} s" if median_time is not None else "not reached",
                f"{times} ({summary['reached']}/{len(summary['seeds'])} reached)",
                f"{summary['median_final_accuracy']:.3f} [{low:.3f}, {high:.3f}]",
            ]
        )
    table = c.markdown_table(
        [
            "side",
            "seeds",
            "median step (s)",
            "median time to target",
            "time to target per seed (s)",
            "final acc: median [min, max]",
        ],
        rows,
    )
    low, high = wilson_interval(round(start_accuracy * len(eval_prompts)), len(eval_prompts))
    log(
        f"\nstart accuracy {start_accuracy:.3f} (95% [{low:.3f}, {high:.3f}]), target {target:.3f} "
        f"({target_from}), {args.budget:.0f} s of training a run\n\n{table}\n"
    )
    report = {
        **c.report_header("time_to_accuracy", argv, threads, settings),
        "model": args.model,
        "dtype": dtype,
        "budget_s": args.budget,
        "eval_every": args.eval_every,
        "train": args.train,
        "eval": args.eval,
        "eval_prompts": len(eval_prompts),
        "start_accuracy": start_accuracy,
        "start_interval": [low, high],
        "target": target,
        "target_from": target_from,
        "trl_skipped": trl_skipped,
        "sides": sides,
        "runs": runs,
        "curves_jsonl": str(out_dir / "curves.jsonl"),
        "curves_png": str(out_dir / "curves.png"),
        "markdown": table,
    }
    c.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
