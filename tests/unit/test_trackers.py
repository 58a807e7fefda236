"""The experiment trackers a job names write real files with the real libraries, offline, and the tests
read them back: TensorBoard event files, an offline W&B run, an MLflow file store. A tracker that is not
installed stops the run before it starts instead of being skipped.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from decentralized_verl.cli.plotting import plot_run, smoothed
from decentralized_verl.reporting.metrics import MetricsLog, read_metrics
from decentralized_verl.reporting.trackers import RunInfo, TrackerError, flatten, open_trackers
from tests.support.tracker_files import SAMPLES, log_three_steps, tensorboard_run


def test_tensorboard_event_files_hold_metrics_config_and_samples(tmp_path: Path) -> None:
    log_three_steps(tmp_path, ["tensorboard"])
    events = tensorboard_run(tmp_path / "tensorboard" / "tiny-run")
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("reward_mean")] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
    ]
    assert {"kl", "entropy", "grad_norm"} <= set(events.Tags()["scalars"])
    assert "step" not in events.Tags()["scalars"]
    samples = events.Tensors("samples/text_summary")[0]
    table = samples.tensor_proto.string_val[0].decode()
    assert samples.step == 3 and "| 3+4= |" in table and "| 7 |" in table
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"learningRate": 0.001' in config


def test_a_tracker_that_is_not_installed_stops_the_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that is absent
    with pytest.raises(TrackerError, match=r"wandb but it is not installed here \(pip install"):
        open_trackers(["wandb"], RunInfo("r", "p", tmp_path))
    with pytest.raises(TrackerError):
        MetricsLog(tmp_path / "metrics.jsonl", ["wandb"])


def test_samples_file_and_flattened_config(tmp_path: Path) -> None:
    log_three_steps(tmp_path, [])
    rows = read_metrics(tmp_path / "samples.jsonl")
    assert rows == [{"step": 3, **SAMPLES[0]}, {"step": 3, **SAMPLES[1]}]
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {"a.b": "1", "a.c": "[1, 2]", "d": "x"}


def test_plot_draws_loss_entropy_and_grad_norm_panels_smoothed(tmp_path: Path) -> None:
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        for step in range(1, 11):
            log.write(
                {"step": step, "reward_mean": step % 3, "pg_loss": 0.1, "entropy": 1.0, "grad_norm": 0.5}
            )
    written = {p.name for p in plot_run(tmp_path, smooth=0.8)}
    assert {"pg_loss.png", "entropy.png", "grad_norm.png", "reward_mean.png", "overview.png"} <= written
    assert smoothed([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # no pull towards 0
    assert smoothed([0.0, 10.0], 0.5)[1] == pytest.approx(10 * 0.5 / 0.75)
    with pytest.raises(ValueError, match="smooth"):
        plot_run(tmp_path, smooth=1.0)
