"""Time to a target held-out accuracy on the shipped arithmetic task: our runtime vs TRL, same wall budget.

    python benchmarks/time_to_accuracy.py --budget 600                 # SmolLM2-135M bf16, 10 min a side
    python benchmarks/time_to_accuracy.py --budget 600 --target 0.55
    python benchmarks/time_to_accuracy.py --tiny                       # smoke: < 60 s (the test suite)

Both sides train from the same SmolLM2-135M-Instruct weights with the settings of
examples/smollm2-arithmetic-grpo.yaml: GRPO (Dr.GRPO: no std scaling), 8 prompts x 8 samples x 32 tokens,
micro-batches of 2 prompts, lr 1e-5, the one-shot \\boxed{} demo, data/arithmetic/small_train.jsonl. Our
side is the runtime's colocated Coordinator; TRL's is GRPOTrainer (gradient checkpointing off, no autocast,
loss bnpo, scale_rewards none). Each side gets `--budget` seconds of training time; every `--eval-every`
steps the clock stops and the same evaluator (greedy decoding, our HF backend, the `boxed` reward) scores
the held-out small_eval.jsonl. Accuracy = share of prompts answered exactly. Time to target = training
seconds at the first evaluation that reaches it. Writes `curves.jsonl` (one point per evaluation) and
`curves.png` under --out-dir, and prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
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


def plot(curves: list[c.Curve], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for curve in curves:
        ax.plot(
            [p["train_s"] for p in curve.points],
            [p["accuracy"] for p in curve.points],
            "o-",
            label=curve.side,
        )
    ax.axhline(target, color="grey", linestyle="--", label=f"target {target:.2f}")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("time to accuracy: arithmetic (small sums), GRPO")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(c.MODELS))
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds per side")
    parser.add_argument("--eval-every", type=int, default=2, help="steps between evaluations")
    parser.add_argument("--eval-limit", type=int, default=None, help="held-out prompts (default: all 33)")
    parser.add_argument("--target", type=float, default=None, help="accuracy to reach")
    parser.add_argument(
        "--target-gain", type=float, default=0.09, help="without --target: start accuracy + this (3 of 33)"
    )
    parser.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--microbatch-prompts", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out-dir", default="runs/time_to_accuracy", help="curves.jsonl, curves.png")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument("--tiny", action="store_true", help="smoke: tiny model, 4 s a side, < 60 s")
    args = parser.parse_args(argv)
    if args.tiny:
        args.model, args.budget, args.eval_every, args.eval_limit = "tiny-smoke", 4.0, 1, 4
        args.prompts, args.samples, args.new_tokens, args.microbatch_prompts = 2, 4, 8, 1
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
    settings = c.grpo_settings(args, learning_rate=args.learning_rate, norm_adv_by_std=False)
    base, tokenizer, _ = c.load_model(args.model, dtype)
    prompts = c.arithmetic_prompts(tokenizer, "small_train")
    eval_prompts = c.arithmetic_prompts(tokenizer, "small_eval", limit=args.eval_limit)
    began = time.perf_counter()
    start_accuracy = evaluate(base, tokenizer, eval_prompts, args.new_tokens)
    start_point = {"step": 0, "train_s": 0.0, "accuracy": start_accuracy, "reward_mean": None}
    start_point["eval_s"] = time.perf_counter() - began
    target = args.target if args.target is not None else min(1.0, start_accuracy + args.target_gain)
    log(f"start accuracy {start_accuracy:.3f}; target {target:.3f}; budget {args.budget:.0f} s a side")

    recorders: list[Recorder] = []
    for side in args.sides:
        log(f"{side}: training")
        if side == "ours":
            recorders.append(
                run_ours(args, base, tokenizer, prompts, eval_prompts, settings, dtype, start_point)
            )
        else:
            recorders.append(run_trl(args, base, tokenizer, prompts, eval_prompts, settings, start_point))

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "curves.jsonl").open("w") as handle:
        for recorder in recorders:
            for point in recorder.curve.points:
                handle.write(json.dumps(point) + "\n")
    plot([r.curve for r in recorders], target, out_dir / "curves.png")

    sides: dict[str, Any] = {}
    rows = []
    for recorder in recorders:
        hit = recorder.curve.reached(target)
        best = max(p["accuracy"] for p in recorder.curve.points)
        sides[recorder.curve.side] = {
            "steps": recorder.steps,
            "train_s": recorder.train_s,
            "median_step_s": c.median(recorder.step_times),
            "final_accuracy": recorder.curve.points[-1]["accuracy"],
            "best_accuracy": best,
            "time_to_target_s": hit["train_s"] if hit else None,
            "steps_to_target": hit["step"] if hit else None,
            "curve": recorder.curve.points,
        }
        rows.append(
            [
                recorder.curve.side,
                recorder.steps,
                c.median(recorder.step_times),
                f"{start_accuracy:.3f}",
                f"{recorder.curve.points[-1]['accuracy']:.3f}",
                f"{best:.3f}",
                f"{hit['train_s']:.0f} s (step {hit['step']})" if hit else "not reached",
            ]
        )
    table = c.markdown_table(
        [
            "side",
            "steps in budget",
            "median step (s)",
            "start acc",
            "final acc",
            "best acc",
            "time to target",
        ],
        rows,
    )
    log("\n" + table + "\n")
    report = {
        **c.report_header("time_to_accuracy", argv, threads, settings),
        "model": args.model,
        "dtype": dtype,
        "budget_s": args.budget,
        "eval_every": args.eval_every,
        "eval_prompts": len(eval_prompts),
        "start_accuracy": start_accuracy,
        "target": target,
        "trl_skipped": trl_skipped,
        "sides": sides,
        "curves_jsonl": str(out_dir / "curves.jsonl"),
        "curves_png": str(out_dir / "curves.png"),
        "markdown": table,
    }
    c.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
