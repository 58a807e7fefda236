"""Training metrics as JSONL, one object a line (what `dverl plot`, `dverl status` and people read), with
the job's experiment trackers (TensorBoard, W&B, MLflow: `trackers.py`) fed the same numbers."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from decentralized_verl.reporting.trackers import RunInfo, Tracker, open_trackers

log = logging.getLogger(__name__)
EVAL_FILE = "eval.jsonl"
SAMPLES_FILE = "samples.jsonl"


class MetricsLog:
    """One JSON object per line, flushed per step, so a crash loses at most the step in flight."""

    def __init__(
        self,
        path: Path,
        loggers: list[str] | None = None,
        *,
        stage: str | None = None,
        run: RunInfo | None = None,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.stage = stage
        """Written into every record when set (the SFT and reward-model stages share one file format)."""
        self.eval_path = path.with_name(EVAL_FILE)
        """Evaluations, one line each (step 0 is the one before training): accuracy, its 95% interval."""
        self.samples_path = path.with_name(SAMPLES_FILE)
        """Sample generations (prompt, response, reward) of every step the job logs them on."""
        info = run or RunInfo(name=path.parent.name, project="dverl", folder=path.parent)
        self.trackers: list[Tracker] = open_trackers(list(loggers or []), info) if loggers else []
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        if self.stage is not None:
            record["stage"] = self.stage
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()
        step = int(record.get("step", 0))
        numbers = {
            k: v
            for k, v in clean.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("step", "time")
        }
        for tracker in self.trackers:
            tracker.log(numbers, step)

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of generations (`prompt`, `response`, `reward`) to the file and every tracker."""
        rows = [{"step": step, **row} for row in rows]
        with self.samples_path.open("a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, sort_keys=True) + "\n")
        for tracker in self.trackers:
            tracker.log_samples(rows, step)

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
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


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
