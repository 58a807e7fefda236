"""The coordinator's progress: the state the Status RPC serves, the metrics JSONL, optional loggers.

The operator polls Status and writes `.status`; `dverl run` draws its progress bar from the same state.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class ProgressState:
    step: int = 0
    total_steps: int = 0
    phase: str = "starting"
    state: str = "Pending"
    reward_mean: float = 0.0
    reward_std: float = 0.0
    kl: float = 0.0
    response_length_mean: float = 0.0
    policy_version: int = 0
    tokens_per_second: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    last_checkpoint: str = ""
    eval_accuracy: float | None = None
    volunteers: int = 0
    blocked_peers: dict[str, str] = field(default_factory=dict)
    """peer id -> reason, in blocking order (the operator counts them and raises an Event for each)."""
    started: float = field(default_factory=time.time)

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("started")
        return out


class MetricsLog:
    """One JSON object per line, flushed per step, so a crash loses at most the step in flight."""

    def __init__(self, path: Path, loggers: list[str] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
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
