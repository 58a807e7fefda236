"""`dverl plot RUN_DIR`: PNG curves from metrics.jsonl, where people look (next to the metrics).

Noisy per-step curves (reward, loss, KL) are drawn smoothed (an exponential moving average, as
TensorBoard's slider does) over the raw values drawn faintly; evaluations are drawn raw with their
95% intervals."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from decentralized_verl.errors import DataError
from decentralized_verl.reporting.metrics import EVAL_FILE, read_evals, read_metrics

PANELS = (
    ("reward_mean", "reward (mean per step)"),
    ("kl", "KL to reference"),
    ("pg_loss", "policy loss"),
    ("entropy", "entropy (nats/token)"),
    ("grad_norm", "grad norm (before clipping)"),
    ("pg_approx_kl", "KL of the update to the rollout policy"),
    ("pg_clip_frac", "clipped fraction"),
    ("response_length_mean", "response length (tokens)"),
    ("eval_accuracy", "eval accuracy"),
    ("tokens_per_second", "rollout tokens/s"),
    ("step_seconds", "seconds per step"),
)


RAW_PANELS = ("eval_accuracy",)
"""Drawn unsmoothed: few points, each with its own interval."""


def smoothed(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's debiasing (the first points are not pulled to 0)."""
    out, last, norm = [], 0.0, 0.0
    for value in values:
        last = weight * last + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        out.append(last / norm)
    return out


def plot_run(run_dir: str | Path, smooth: float = 0.6) -> list[Path]:
    """One PNG per metric found, plus an overview grid; returns the written paths. `smooth` in [0, 1):
    the moving average's weight (0 draws the raw values only)."""
    if not 0 <= smooth < 1:
        raise ValueError(f"smooth must be in [0, 1) (got {smooth})")
    folder = Path(run_dir)
    records = read_metrics(folder / "metrics.jsonl")
    if not records:
        raise DataError(f"{folder / 'metrics.jsonl'}: no metrics to plot (has the run made a step?)")
    out_dir = folder / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    evals = read_evals(folder / EVAL_FILE)
    if evals:  # the step-0 evaluation and the 95% intervals live there, not in the per-step rows
        records = [{k: v for k, v in r.items() if not k.startswith("eval_")} for r in records] + evals
    present = [(key, title) for key, title in PANELS if any(r.get(key) is not None for r in records)]
    written: list[Path] = []
    # Figures of their own, not pyplot's: no GUI backend and no process-wide figure registry to close.
    fig = Figure(figsize=(7, 2.4 * len(present)))
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], present, strict=True):
        points = sorted((r["step"], r[key]) for r in records if r.get(key) is not None)
        xs, ys = zip(*points, strict=True)
        band = _interval_band(records, key)
        single = Figure(figsize=(6, 3.5))
        single_ax = single.subplots()
        marker = "o" if len(xs) < 30 else None
        for target in (ax, single_ax):
            if smooth and key not in RAW_PANELS and len(xs) > 2:
                line = target.plot(xs, ys, alpha=0.25, linewidth=0.8)[0]
                target.plot(xs, smoothed(list(ys), smooth), color=line.get_color(), linewidth=1.4)
            else:
                target.plot(xs, ys, marker=marker, linewidth=1.2)
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        if band is not None:
            for target in (ax, single_ax):
                target.fill_between(*band, alpha=0.2, label="95% interval")
            single_ax.legend(fontsize=8)
        single_ax.set_xlabel("step")
        single_ax.set_title(title)
        single_ax.grid(alpha=0.3)
        path = out_dir / f"{key}.png"
        single.tight_layout()
        single.savefig(path, dpi=100)
        written.append(path)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    overview = out_dir / "overview.png"
    fig.savefig(overview, dpi=100)
    return [overview, *written]


def _interval_band(records: list[dict], key: str) -> tuple[list[float], list[float], list[float]] | None:
    """(steps, low, high) where the records carry `<key>_low` / `<key>_high` (evaluations do)."""
    rows = sorted(
        (r["step"], r[f"{key}_low"], r[f"{key}_high"]) for r in records if r.get(f"{key}_low") is not None
    )
    if not rows:
        return None
    steps, low, high = zip(*rows, strict=True)
    return list(steps), list(low), list(high)
