"""`dverl status RUN_DIR`: where a run stands, read from its folder (metrics, evaluations, logs, summary).

Reads only files the run writes anyway, so it works on a run in progress, a finished one, or one copied
off a pod's volume; it never talks to the workers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from decentralized_verl.errors import DverlError
from decentralized_verl.launch.run_record import FINISHED, RUNNING, recorded_state
from decentralized_verl.reporting.metrics import EVAL_FILE, read_evals, read_metrics
from decentralized_verl.reporting.progress import format_duration
from decentralized_verl.spec import safe_yaml

PACE_WINDOW = 20
"""Steps the ETA's pace is measured over (recent steps say more about the rest than the first ones)."""


class NotARunFolder(DverlError):
    """The folder has none of the files a run writes."""


def _total_steps(run_dir: Path, summary: dict[str, Any] | None) -> int | None:
    job = run_dir / "job.yaml"
    if job.exists():
        try:
            steps = (
                ((safe_yaml.load(safe_yaml.read_limited(job)) or {}).get("spec") or {})
                .get("training", {})
                .get("steps")
            )
        except (yaml.YAMLError, AttributeError):
            steps = None
        if isinstance(steps, int):
            return steps
    return int(summary["steps"]) if summary and "steps" in summary else None


def _eta(records: list[dict[str, Any]], total: int | None) -> float | None:
    recent = [r for r in records[-PACE_WINDOW:] if isinstance(r.get("time"), int | float)]
    if total is None or len(recent) < 2:
        return None
    steps = recent[-1]["step"] - recent[0]["step"]
    seconds = recent[-1]["time"] - recent[0]["time"]
    if steps <= 0 or seconds <= 0:
        return None
    return max(total - recent[-1]["step"], 0) * seconds / steps


ACTIVE_STATES = frozenset({RUNNING, "starting"})
"""States whose processes are working on the run; `--watch` follows only these."""


def _state(run_dir: Path, summarised: bool, stepped: bool) -> tuple[str, str]:
    """Finished when the learner wrote its summary; else what `dverl run` recorded (failed, interrupted,
    or gone without a word); a folder with no record (copied off a pod) is judged by its files alone."""
    if summarised:
        return FINISHED, ""
    recorded = recorded_state(run_dir)
    if recorded is not None and recorded[0] != RUNNING:
        return recorded
    return (RUNNING if stepped else "starting"), ""


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """The run's state as plain data (what `--json` prints)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NotARunFolder(f"{run_dir}: no such folder")
    metrics = run_dir / "metrics.jsonl"
    summary_path = run_dir / "summary.json"
    if not any(p.exists() for p in (metrics, summary_path, run_dir / "job.yaml")):
        raise NotARunFolder(f"{run_dir}: not a run folder (no metrics.jsonl, job.yaml or summary.json)")
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    records = read_metrics(metrics)
    last = records[-1] if records else {}
    total = _total_steps(run_dir, summary)
    evals = read_evals(run_dir / EVAL_FILE)
    logs = run_dir / "logs"
    state, detail = _state(run_dir, summary is not None, bool(records))
    return {
        "run_dir": str(run_dir),
        "state": state,
        "state_detail": detail,
        "step": int(last.get("step", 0)),
        "total_steps": total,
        "reward_mean": last.get("reward_mean"),
        "kl": last.get("kl"),
        "refit_logprob_diff_mean": last.get("refit_logprob_diff_mean"),
        "refit_logprob_diff_max": last.get("refit_logprob_diff_max"),
        "reward_errors": last.get("reward_errors"),
        "reward_errors_total": sum(int(r.get("reward_errors") or 0) for r in records),
        "reward_error": next((r["reward_error"] for r in records if r.get("reward_error")), None),
        "tokens_per_second": last.get("tokens_per_second"),
        "eta_seconds": _eta(records, total) if state in ACTIVE_STATES else None,
        "rollout_workers": last.get("rollout_workers"),
        "workers": sorted(p.stem for p in logs.glob("*.log")) if logs.is_dir() else [],
        "last_eval": evals[-1] if evals else None,
        "last_checkpoint": (summary or {}).get("last_checkpoint") or last.get("checkpoint"),
        "updated": last.get("time"),
    }


def render_status(status: dict[str, Any]) -> str:
    """A few lines a person reads at a glance."""
    total = status["total_steps"]
    step = f"{status['step']}/{total}" if total else str(status["step"])
    lines = [f"{status['run_dir']}: {status['state']}, step {step}"]
    if status.get("state_detail"):
        lines[0] += f" ({status['state_detail']})"
    if status["reward_mean"] is not None:
        numbers = f"reward {status['reward_mean']:.3f}"
        if status["kl"] is not None:
            numbers += f", kl {status['kl']:.4f}"
        if status["tokens_per_second"] is not None:
            numbers += f", {status['tokens_per_second']:.0f} tokens/s"
        lines.append(numbers)
    if status.get("refit_logprob_diff_mean") is not None:
        lines.append(
            f"refit parity: rollout vs learner log-probs differ by {status['refit_logprob_diff_mean']:.2e} "
            f"on average, {status['refit_logprob_diff_max']:.2e} at most (last step)"
        )
    if status.get("reward_errors_total"):
        lines.append(
            f"reward errors: {status['reward_errors'] or 0} in the last step, "
            f"{status['reward_errors_total']} in all (those samples scored 0); "
            f"first: {status['reward_error']}"
        )
    if status["state"] in ACTIVE_STATES:
        lines.append(f"eta {format_duration(status['eta_seconds'])}")
    if status["workers"]:
        serving = status["rollout_workers"]
        active = f" ({serving} rollout serving the last step)" if serving is not None else ""
        lines.append(f"workers {len(status['workers'])}: {', '.join(status['workers'])}{active}")
    last_eval = status["last_eval"]
    if last_eval:
        lines.append(
            f"last eval (step {last_eval['step']}): accuracy {100 * last_eval['eval_accuracy']:.1f}% "
            f"[{100 * last_eval['eval_accuracy_low']:.1f}-{100 * last_eval['eval_accuracy_high']:.1f}] "
            f"on {last_eval['eval_problems']} problems"
        )
    if status["last_checkpoint"]:
        lines.append(f"checkpoint {status['last_checkpoint']}")
    return "\n".join(lines)
