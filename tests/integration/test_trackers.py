"""The experiment trackers a job names write real files with the real libraries, offline, and the tests
read them back: TensorBoard event files, an offline W&B run, an MLflow file store. A tracker that is not
installed stops the run before it starts instead of being skipped.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tracker_files import log_three_steps, wandb_run


def test_wandb_offline_run_has_name_config_history_and_table(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_three_steps(tmp_path, ["wandb"])
    run = wandb_run(tmp_path)
    assert run["name"] == "tiny-run" and run["project"] == "dverl-tests"
    assert run["config"]["training"] == {"steps": 3, "learningRate": 0.001}
    rows = {row["_step"]: row for row in run["history"]}
    assert [rows[s]["reward_mean"] for s in (1, 2, 3)] == [0.1, 0.2, 0.3]
    assert rows[3]["samples/_type"] == "table-file" and rows[3]["samples/nrows"] == 2
    (table_file,) = tmp_path.glob("wandb/offline-run-*/files/" + rows[3]["samples/path"])
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "prompt", "response", "reward"]
    assert table["data"][0] == [3, "3+4=", "7", 1.0]


def test_mlflow_file_store_has_run_params_metrics_and_samples(tmp_path: Path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_three_steps(tmp_path, ["mlflow"])
    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("dverl-tests")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tiny-run"
    assert run.data.params["training.learningRate"] == "0.001" and run.data.params["algorithm.name"] == "grpo"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"job_spec.json", "samples"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "samples/step_000003.json", str(tmp_path / "dl")))
    table = json.loads(local.read_text())
    assert table["columns"] == ["step", "prompt", "response", "reward"]
    assert table["data"][1] == [3, "1+1=", "3", 0.0]
