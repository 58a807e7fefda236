"""`dverl train` runs a stage from a config file and prints what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def test_dverl_train_sft_stage_from_cli(tmp_path: Path) -> None:
    data = tmp_path / "sft.json"
    data.write_text(json.dumps([{"prompt": f"{a}+{a}=", "completion": str(2 * a)} for a in range(5)]))
    config = tmp_path / "stages.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
                "sft": {
                    "trainFile": "sft.json",
                    "epochs": 30,
                    "batchSize": 5,
                    "learningRate": 1.0e-2,
                    "format": "plain",
                    "outputDir": "out/sft",
                },
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", "train", "--stage", "sft", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("stage sft:"))
    assert "checkpoint" in line and (tmp_path / "out" / "sft").is_dir()
    assert (tmp_path / "out" / "sft" / "metrics.jsonl").exists()


def test_dverl_train_bad_config_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "stages.yaml"
    config.write_text("model: {tiny: {}}\nsft: {trainFile: x.json, batchSize: 0, outputDir: o}\n")
    result = subprocess.run(
        [sys.executable, "-m", "decentralized_verl.cli", "train", "--stage", "sft", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "sft.batchSize" in result.stderr and "Traceback" not in result.stderr
