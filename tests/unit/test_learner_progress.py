"""The training loop, run for real in this process, tells people how it goes: a plain progress line per
step in the learner's log, entropy every step, a sample-generations table every `samplesEvery` steps,
and the job's tracker fed the same numbers (TensorBoard's event files read back)."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from decentralized_verl.core.status import StatusBoard
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.spec.manifest import parse_spec
from tests.support.in_process import run_in_process
from tests.support.paths import TOY
from tests.support.tracker_files import tensorboard_run

LINE = re.compile(r"^step (\d)/3 reward \d\.\d{3}( acc \d+\.\d%)? tok/s \d+ eta (\?|\d+s)$")


async def _train(output: Path, board: StatusBoard) -> dict:
    spec = parse_spec(
        {
            "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {
                "train": str(TOY / "train.jsonl"),
                "eval": str(TOY / "eval.jsonl"),
                "evalSamples": 8,
                "rewardType": "decentralized_verl.rewards.toy:first_number",
                "maxPromptTokens": 32,
                "maxNewTokens": 3,
            },
            "roles": {"rollout": {"replicas": 0, "batchSize": 4}, "learner": {"replicas": 1}},
            "training": {
                "steps": 3,
                "batchSize": 4,
                "learningRate": 1e-3,
                "evalEvery": 2,
                "logging": ["tensorboard"],
                "tracking": {"runName": "progress", "samplesEvery": 2, "samples": 3},
            },
        }
    )
    model, tokenizer = load_model_and_tokenizer(spec.model)
    return await run_in_process(spec, model, tokenizer, output, job="progress", status=board)


def test_progress_lines_samples_entropy_and_tracker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="decentralized_verl.orchestration.coordinator"):
        asyncio.run(_train(tmp_path, board := StatusBoard()))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 3 and all(LINE.match(line) for line in lines), lines
    assert [LINE.match(line).group(1) for line in lines] == ["1", "2", "3"]
    assert " acc " in lines[1] and " acc " not in lines[0]  # accuracy on the evaluated step only
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert all(r["entropy"] > 0 for r in records)  # measured every step, entropyCoef 0 or not
    parity = board.current.refit_parity  # what the Status RPC sends: the last step's, refreshed to version 2
    assert parity is not None and parity.version == 2 and parity.tokens > 0, parity
    assert parity.diff_mean == records[-1]["refit_logprob_diff_mean"] < 1e-3
    samples = read_metrics(tmp_path / "samples.jsonl")
    assert [s["step"] for s in samples] == [2, 2, 2]
    assert all(s["prompt"] and isinstance(s["response"], str) and s["reward"] is not None for s in samples)
    events = tensorboard_run(tmp_path / "tensorboard" / "progress")
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2, 3]
    assert {"entropy", "grad_norm", "pg_loss"} <= set(events.Tags()["scalars"])
    assert [t.step for t in events.Tensors("samples/text_summary")] == [2]
