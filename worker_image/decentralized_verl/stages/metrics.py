"""Append-only JSONL metrics (one object a line), which `dverl plot` and people can both read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, path: Path, stage: str) -> None:
        self.path = path
        self.stage = stage
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, **values: Any) -> None:
        line = {"stage": self.stage, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line, sort_keys=True) + "\n")
