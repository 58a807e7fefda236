"""Training metrics as JSONL, one object a line (what `dverl plot` and people read), with optional
TensorBoard / W&B loggers beside it."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
EVAL_FILE = "eval.jsonl"


class MetricsLog:
    """One JSON object per line, flushed per step, so a crash loses at most the step in flight."""

    def __init__(self, path: Path, loggers: list[str] | None = None, *, stage: str | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.stage = stage
        """Written into every record when set (the SFT and reward-model stages share one file format)."""
        self._file = path.open("a", encoding="utf-8")
        self.eval_path = path.with_name(EVAL_FILE)
        """Evaluations, one line each (step 0 is the one before training): accuracy, its 95% interval."""
        self._tensorboard = None
        self._wandb = None
        for name in loggers or []:
            self._enable(name, path.parent)

    def _enable(self, name: str, folder: Path) -> None:
        try:
            if name == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(folder / "tensorboard"))
            elif name == "wandb":
                import wandb

                self._wandb = wandb.init(project="dverl", dir=str(folder), reinit=True)
        except ImportError as exc:
            log.warning("%s logging requested but not installed (%s); continuing with JSONL only", name, exc)

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        if self.stage is not None:
            record["stage"] = self.stage
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()
        step = int(record.get("step", 0))
        numbers = {k: v for k, v in clean.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def write_eval(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        with self.eval_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_evals(path: Path) -> list[dict[str, Any]]:
    """The evaluations of a run folder's `eval.jsonl` by step, the last one of a step winning (a learner
    that restarted evaluates again where it resumes)."""
    by_step = {int(r["step"]): r for r in read_metrics(path)}
    return [by_step[step] for step in sorted(by_step)]


def truncate_after(path: Path, step: int) -> int:
    """Drop the rows of steps after `step` (a resumed run does them again); returns how many went.
    Rewritten atomically, so a crash here loses nothing."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and int(json.loads(line).get("step", 0)) <= step]
    dropped = sum(1 for line in lines if line.strip()) - len(kept)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
    return dropped
