"""Experiment trackers beside metrics.jsonl: TensorBoard, Weights & Biases and MLflow, each with a run
name, the whole job spec as its config, every numeric metric per step, and a table of sample generations.

A tracker the job names must work: a missing package is an error before training starts (`dverl
validate`/`run` say so first), never a warning while the run goes on without it. Each library is
imported only when its tracker opens. Offline use is each library's own: WANDB_MODE=offline, and
MLflow writes a file store in the run folder unless MLFLOW_TRACKING_URI names a server.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from decentralized_verl.errors import DverlError

TRACKERS = ("tensorboard", "wandb", "mlflow")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
INSTALL = "pip install 'decentralized-verl[trackers]'"
SAMPLE_COLUMNS = ("step", "prompt", "response", "reward")


class TrackerError(DverlError):
    """A tracker the job names cannot be opened (its package missing, its service refusing)."""


@dataclass(frozen=True)
class RunInfo:
    """What every tracker labels a run with."""

    name: str
    project: str
    folder: Path
    config: dict[str, Any] = field(default_factory=dict)


class Tracker(Protocol):
    def log(self, numbers: dict[str, float], step: int) -> None: ...

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def missing_packages(names: list[str] | tuple[str, ...]) -> list[str]:
    """The trackers among `names` whose package is not installed here (found without importing it)."""

    def installed(package: str) -> bool:
        try:
            return importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            return False

    return [n for n in names if not installed(PACKAGES[n])]


def open_trackers(names: list[str] | tuple[str, ...], run: RunInfo) -> list[Tracker]:
    missing = missing_packages(names)
    if missing:
        raise TrackerError(
            f"training.logging names {', '.join(missing)} but it is not installed here ({INSTALL})"
        )
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(OPENERS[name](run))
    except Exception as exc:
        for tracker in opened:
            tracker.close()
        raise TrackerError(f"training.logging: cannot open {name}: {exc}") from exc
    return opened


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`: the flat key/value form MLflow parameters take."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path))
        else:
            flat[path] = json.dumps(value) if not isinstance(value, str) else value
    return flat


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in SAMPLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class TensorBoardTracker:
    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 optional: tensorboard (the trackers extra), for a job that names it

        self.writer = SummaryWriter(str(run.folder / "tensorboard" / run.name))
        self.writer.add_text("config", "```\n" + json.dumps(run.config, indent=2) + "\n```", 0)

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text("samples", _markdown_table(rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run: RunInfo) -> None:
        import wandb  # noqa: PLC0415 optional: wandb (the trackers extra), for a job that names it

        self.wandb = wandb
        self.run = wandb.init(
            project=run.project,
            name=run.name,
            config=run.config,
            dir=str(run.folder),
            reinit="finish_previous",
        )

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        table = self.wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]
        )
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() can return before wandb's service has written the run's file; teardown waits for it,
        # so what a learner logged is on disk when it exits.
        self.wandb.teardown()


class MlflowTracker:
    def __init__(self, run: RunInfo) -> None:
        import mlflow  # noqa: PLC0415 optional: mlflow (the trackers extra), for a job that names it

        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a file store in the run folder: offline, nothing to install, copied with the run
            uri = (run.folder / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(run.project)
        self.run = mlflow.start_run(run_name=run.name)
        params = flatten(run.config)
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 parameters a call
            mlflow.log_params({k: v[:6000] for k, v in items[start : start + 100]})
        mlflow.log_dict(run.config, "job_spec.json")

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({_mlflow_key(k): v for k, v in numbers.items()}, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        columns = {c: [r.get(c) for r in rows] for c in SAMPLE_COLUMNS}
        self.mlflow.log_table(data=columns, artifact_file=f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, `_-./ ` only."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


OPENERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
