"""Read back what the trackers wrote, with each library's own formats: TensorBoard event files through
tensorboard's EventAccumulator, an offline W&B run's transaction log (`run-*.wandb`, LevelDB log records
of wandb's protobuf `Record`s), and an MLflow file store through MlflowClient; and the three steps the
tracker tests log through them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.reporting.trackers import RunInfo

WANDB_HEADER = 7  # b":W&B", a 2-byte magic and a version byte
BLOCK = 32768
RECORD_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every protobuf Record of an offline run's `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pos, pending = [], WANDB_HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER:  # the block's tail is zero padding
            pos += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_run(folder: Path) -> dict[str, Any]:
    """The run's name, project, config and history rows ({key: value} by step) from its `.wandb` file."""
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    out: dict[str, Any] = {"config": {}, "history": []}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["project"] = record.run.display_name, record.run.project
            out["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            out["history"].append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            )
    return out


def tensorboard_run(folder: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


CONFIG = {"job": "tiny", "training": {"steps": 3, "learningRate": 0.001}, "algorithm": {"name": "grpo"}}
SAMPLES = [
    {"prompt": "3+4=", "response": "7", "reward": 1.0},
    {"prompt": "1+1=", "response": "3", "reward": 0.0},
]


def log_three_steps(folder: Path, trackers: list[str]) -> None:
    """Three steps of metrics and one table of samples through `trackers`, as a run would log them."""
    run = RunInfo("tiny-run", "dverl-tests", folder, CONFIG)
    with MetricsLog(folder / "metrics.jsonl", trackers, run=run) as log:
        for step in (1, 2, 3):
            log.write(
                {
                    "step": step,
                    "reward_mean": step / 10,
                    "kl": 0.0,
                    "entropy": 1.5 - step / 10,
                    "grad_norm": 2.0,
                }
            )
        log.write_samples(3, SAMPLES)
