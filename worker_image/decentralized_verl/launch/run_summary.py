"""Pure over the run folder's files: the first and last rewards and evaluations a finished run reports,
over every learner incarnation, and the lines `dverl run` prints at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from decentralized_verl.reporting.metrics import read_evals, read_metrics
from decentralized_verl.reporting.stats import difference_interval


def reward_window(metrics: Path) -> dict[str, float] | None:
    """First and last rewards over the whole run (every learner incarnation), as the summary states them."""
    rewards = [float(r["reward_mean"]) for r in read_metrics(metrics) if r.get("reward_mean") is not None]
    if not rewards:
        return None
    window = max(1, min(5, len(rewards) // 3 or 1))
    return {
        "reward_first": sum(rewards[:window]) / window,
        "reward_last": sum(rewards[-window:]) / window,
    }


def eval_ends(evals: Path) -> dict[str, Any] | None:
    """The first evaluation (before training, even if the learner restarted since) and the last one."""
    rows = read_evals(evals)
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    ends = {
        "eval_accuracy_before": first["eval_accuracy"],
        "eval_interval_before": [first["eval_accuracy_low"], first["eval_accuracy_high"]],
        "eval_accuracy_after": last["eval_accuracy"],
        "eval_interval_after": [last["eval_accuracy_low"], last["eval_accuracy_high"]],
        "eval_problems": last["eval_problems"],
    }
    if len(rows) > 1:
        counts = [(round(r["eval_accuracy"] * r["eval_problems"]), r["eval_problems"]) for r in (first, last)]
        ends["eval_gain"] = last["eval_accuracy"] - first["eval_accuracy"]
        ends["eval_gain_interval"] = list(difference_interval(*counts))
    return ends


def format_summary(summary: dict[str, Any], output: Path) -> str:
    def pct(value: float | None, interval: list[float] | None = None) -> str:
        if value is None:
            return "n/a"
        if not interval:
            return f"{100 * value:.1f}%"
        return f"{100 * value:.1f}% [{100 * interval[0]:.1f}-{100 * interval[1]:.1f}]"

    problems = (
        f" on {summary['eval_problems']} problems, 95% intervals" if summary.get("eval_problems") else ""
    )
    if summary.get("eval_gain_interval"):
        low, high = summary["eval_gain_interval"]
        problems += f"; gain {100 * summary['eval_gain']:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}]"
    return (
        f"done: {summary['steps']} steps in {summary['seconds']:.0f} s; "
        f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; "
        f"eval accuracy {pct(summary.get('eval_accuracy_before'), summary.get('eval_interval_before'))} -> "
        f"{pct(summary.get('eval_accuracy_after'), summary.get('eval_interval_after'))}{problems}\n"
        f"metrics: {output / 'metrics.jsonl'}  (plot: dverl plot {output})"
        + (f"\ncheckpoint: {summary['last_checkpoint']}" if summary.get("last_checkpoint") else "")
    )
