"""The experiment trackers a job names write real files with the real libraries, offline, and the tests
read them back: TensorBoard event files, an offline W&B run, an MLflow file store. A tracker that is not
installed stops the run before it starts instead of being skipped.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
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


def _documented_mlflow_commands() -> list[str]:
    """The commands docs/cli.md gives for browsing a run's MLflow file store."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text[text.index("- **MLflow**") :]
    block = block[block.index("```bash") + len("```bash") : block.index("```", block.index("```bash") + 7)]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_documented_mlflow_ui_command_reads_the_file_store_a_run_writes(
    tmp_path: Path, monkeypatch
) -> None:
    install, ui = _documented_mlflow_commands()
    assert install == "pip install mlflow"  # the extra's mlflow-skinny has no `mlflow ui`
    assert ui == "MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri RUN_DIR/mlruns"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_three_steps(tmp_path, ["mlflow"])
    store = (tmp_path / "mlruns").resolve().as_uri()
    read = (
        "import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(sys.argv[1]); "
        "e = c.get_experiment_by_name('dverl-tests'); print(len(c.search_runs([e.experiment_id])))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    # A fresh process, as `mlflow ui` is: the store opens with the documented variable, not without it.
    without = subprocess.run([sys.executable, "-c", read, store], env=env, capture_output=True, text=True)
    assert without.returncode != 0 and "MLFLOW_ALLOW_FILE_STORE" in without.stderr
    name, value = ui.split()[0].split("=", 1)  # the variable the documented command sets
    documented = subprocess.run(
        [sys.executable, "-c", read, store], env={**env, name: value}, capture_output=True, text=True
    )
    assert documented.returncode == 0 and documented.stdout.strip() == "1", documented.stderr[-2000:]
