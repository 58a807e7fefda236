"""Refit parity's arithmetic and verdict: which rows are compared, what the metrics are, who is named."""

from __future__ import annotations

import math

import pytest
import torch

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.orchestration.refit_check import (
    RefitParityError,
    check_refit,
    fresh_rows,
    worst_by_worker,
)
from decentralized_verl.training.refit_parity import ParityMeter


def sample(worker: str, version: int, parts: tuple = ()) -> Sample:
    prompt = Prompt("p", 0, (1, 2), "q")
    return Sample(prompt, 0, (3, 4), (-0.1, -0.2), "stop", "a", version, worker_id=worker, parts=parts)


def test_only_rows_the_current_weights_made_are_compared() -> None:
    samples = [sample("r0", 3), sample("r1", 2), sample("r0", 3, parts=(("r1", 2, 1), ("r0", 3, 1)))]
    assert fresh_rows(samples, 3) == [True, False, False]


def test_the_meter_measures_masked_tokens_of_wanted_rows() -> None:
    meter = ParityMeter(3, torch.tensor([True, True, False]), torch.device("cpu"))
    learner = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    rollout = torch.tensor([[0.1, 9.0], [0.3, 0.0], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])  # row 0's 9.0 is padding; row 2 unwanted
    meter.add(torch.tensor([0, 1, 2]), learner, rollout, mask)
    got = meter.metrics(distributed=False)
    assert got["refit_parity_tokens"] == 3
    assert got["refit_logprob_diff_mean"] == pytest.approx(0.4 / 3)
    assert got["refit_logprob_diff_max"] == pytest.approx(0.3)
    rows = meter.rows()
    assert rows[:2] == pytest.approx([0.1, 0.3]) and math.isnan(rows[2])


def test_nothing_compared_reports_nothing() -> None:
    meter = ParityMeter(2, torch.tensor([False, False]), torch.device("cpu"))
    meter.add(torch.tensor([0, 1]), torch.zeros(2, 2), torch.ones(2, 2), torch.ones(2, 2))
    assert meter.metrics(distributed=False) == {}


def test_within_the_bound_or_unbounded_passes() -> None:
    args = {
        "samples": [sample("r0", 1)],
        "row_max": [0.5],
        "rows": [0],
        "version": 1,
        "learner": "j-learner-0",
    }
    check_refit({"refit_logprob_diff_mean": 0.5}, bound=None, **args)
    check_refit({"refit_logprob_diff_mean": 0.5}, bound=0.5, **args)
    check_refit({}, bound=0.01, **args)  # nothing measured this step (no fresh rows)


def test_past_the_bound_names_the_worst_workers_the_learner_and_the_version() -> None:
    samples = [sample("job-rollout-0", 4), sample("job-rollout-1", 4), sample("job-rollout-1", 4)]
    assert worst_by_worker(samples, [0.001, 2.5, float("nan")], [0, 1, 2]) == {
        "job-rollout-0": 0.001,
        "job-rollout-1": 2.5,
    }
    with pytest.raises(RefitParityError) as caught:
        check_refit(
            {"refit_logprob_diff_mean": 0.9, "refit_logprob_diff_max": 2.5},
            bound=0.05,
            samples=samples,
            row_max=[0.001, 2.5, float("nan")],
            rows=[0, 1, 2],
            version=4,
            learner="job-learner-0",
        )
    said = str(caught.value)
    assert "after the refresh to policy version 4" in said
    assert said.index("job-rollout-1 (max 2.5)") < said.index("job-rollout-0")  # worst first
    assert "learner job-learner-0" in said and "over training.refitParityBound 0.05" in said
