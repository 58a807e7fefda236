"""A reward that fails is never silent: each step counts the samples whose reward failed, the reward
worker's log keeps the first of each failure with its sample and traceback, the console says it once,
`dverl status` shows the counts, and a job whose every reward fails step after step is stopped, naming
the reward and its error."""

from __future__ import annotations

import io
import json
import logging
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from decentralized_verl.cli.main import main
from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.errors import RewardFailed
from decentralized_verl.launch.step_lines import StepLines
from decentralized_verl.orchestration.reward_errors import RewardErrorWatch
from decentralized_verl.orchestration.step_report import step_record
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.serving.scoring import RewardWorker
from decentralized_verl.transport.messages import ScoreItem


@pytest.fixture
def flaky_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`module:function` of a reward that raises on completions containing "x" and scores the rest 1."""
    (tmp_path / "flaky_reward_mod.py").write_text(
        textwrap.dedent(
            """
            def score(completion, reference):
                if "x" in completion:
                    raise KeyError("no such field: answer")
                return 1.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "flaky_reward_mod:score"
    sys.modules.pop("flaky_reward_mod", None)


def test_the_reward_worker_logs_each_failure_once_with_its_sample(flaky_reward: str, caplog) -> None:
    worker = RewardWorker(flaky_reward)
    items = [ScoreItem(f"prompt {i}", "x marks" if i % 2 else "fine", "42", flaky_reward) for i in range(6)]
    with caplog.at_level(logging.WARNING, logger="decentralized_verl.serving.scoring"):
        scores = worker.score_items(items)
        worker.score_items(items)  # the same failure again: counted, not logged again
    assert [s.score for s in scores] == [1.0, 0.0] * 3
    assert scores[1].reason == f"reward error: {flaky_reward} raised KeyError: 'no such field: answer'"
    [logged] = [r.getMessage() for r in caplog.records]
    assert scores[1].reason in logged and "prompt='prompt 1'" in logged and "completion='x marks'" in logged
    assert "reference='42'" in logged and 'raise KeyError("no such field: answer")' in logged
    assert worker.errors.counts == {scores[1].reason: 6}


def _sample(i: int, reason: str) -> Sample:
    return Sample(Prompt(f"p{i}", i, (1, 2), "t"), 0, (3, 4), (0.0, 0.0), "stop", "r", 0, score=0.0,
                  score_reason=reason)  # fmt: skip


def _record(reasons: list[str]) -> dict:
    report = SimpleNamespace(tokens=8, seconds=1.0, redispatched=0, hedged=0, continued=0, failures=[],
                             assigned=["w"], duplicates_dropped=0)  # fmt: skip
    return step_record(
        step=1, version=1, samples=[_sample(i, r) for i, r in enumerate(reasons)], report=report,
        expected_samples=len(reasons), stale_dropped=0, staleness=0, step_seconds=1.0, timings={}, learned=(),
    )  # fmt: skip


def test_each_step_counts_its_failed_rewards_and_keeps_the_first_message() -> None:
    record = _record(["wrong answer", "reward error: m:f raised ValueError: bad", "reward error: other"])
    assert (
        record["reward_errors"] == 2 and record["reward_error"] == "reward error: m:f raised ValueError: bad"
    )
    clean = _record(["wrong answer", "correct"])
    assert clean["reward_errors"] == 0 and "reward_error" not in clean


def test_a_job_whose_rewards_all_fail_for_n_steps_in_a_row_stops_naming_them(caplog) -> None:
    watch = RewardErrorWatch("m:f", limit=3)
    failing = {"samples": 4, "reward_errors": 4, "reward_error": "reward error: m:f raised ValueError: bad"}
    with caplog.at_level(logging.WARNING, logger="decentralized_verl.orchestration.reward_errors"):
        watch.observe(1, failing)
        watch.observe(2, failing)
        watch.observe(3, {"samples": 4, "reward_errors": 3, "reward_error": failing["reward_error"]})
        watch.observe(4, failing)  # a step with one good reward started the count again
        watch.observe(5, failing)
        with pytest.raises(RewardFailed) as stopped:
            watch.observe(6, failing)
    said = str(stopped.value)
    assert "data.rewardType m:f" in said and "3 steps in a row (steps 4-6" in said
    assert "raised ValueError: bad" in said and "data.rewardErrorSteps is 3" in said
    assert len(caplog.records) == 1 and "first: reward error: m:f" in caplog.records[0].getMessage()


def test_a_limit_of_zero_never_stops() -> None:
    watch = RewardErrorWatch("m:f", limit=0)
    for step in range(1, 50):
        watch.observe(step, {"samples": 2, "reward_errors": 2, "reward_error": "reward error: x"})


def test_the_console_says_the_first_failure_once_and_status_counts_them(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    with MetricsLog(run / "metrics.jsonl") as log:
        for step in (1, 2, 3):
            errors = {"reward_errors": 4, "reward_error": f"reward error: m:f raised ValueError: {step}"}
            log.write({"step": step, "samples": 16, "reward_mean": 0.0, **(errors if step > 1 else {})})
    out = io.StringIO()
    StepLines(run, total=3, out=out).catch_up()
    notices = [line for line in out.getvalue().splitlines() if line.startswith("reward error")]
    assert notices == [
        "reward error at step 2 (4 of 16 samples scored 0 because the reward failed): reward error: m:f "
        "raised ValueError: 2; the reward worker's log has the sample and traceback"
    ]
    assert main(["status", str(run)]) == 0
    assert "reward errors: 4 in the last step, 8 in all" in capsys.readouterr().out
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["reward_errors"] == 4 and status["reward_errors_total"] == 8
    assert status["reward_error"] == "reward error: m:f raised ValueError: 2"
