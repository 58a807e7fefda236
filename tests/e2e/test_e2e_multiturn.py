"""`dverl run examples/tiny-multiturn.yaml` as shipped (a few steps): real worker processes over gRPC, the
rollout worker playing the guessing game, the learner training on the episodes, the reward replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from decentralized_verl.launch.run import run_job
from decentralized_verl.reporting.metrics import read_metrics
from tests.support.paths import ROOT


@pytest.mark.timeout(900)
def test_shipped_multiturn_example_runs(tmp_path: Path) -> None:
    document = yaml.safe_load((ROOT / "examples" / "tiny-multiturn.yaml").read_text())
    data = document["spec"]["data"]
    for key in ("train", "eval"):
        data[key] = str(ROOT / "examples" / data[key])
    document["spec"]["training"].update(steps=4, evalEvery=2)
    manifest = tmp_path / "tiny-multiturn.yaml"
    manifest.write_text(yaml.safe_dump(document))
    summary = run_job(manifest, tmp_path / "run", progress=False, timeout=800)
    assert summary["steps"] == 4 and summary["eval_problems"] == 16
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 4
    for record in records:
        assert record["samples"] == record["unique_samples"] == 64 and record["rollout_workers"] == 1
        assert 1 <= record["turns_mean"] <= 4 and 0 < record["model_token_frac"] < 1
        assert record["reward_mean"] == pytest.approx(record["episode_reward_mean"])  # the replay agrees
        assert "pg_loss" in record
