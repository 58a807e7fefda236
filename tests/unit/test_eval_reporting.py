"""Held-out accuracy reported with its 95% interval: the Wilson interval, eval.jsonl (step 0 included, a
restarted learner's repeat replaced), the summary line and `dverl plot`'s eval panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decentralized_verl.cli.plotting import _interval_band, plot_run
from decentralized_verl.launch.run_summary import eval_ends, format_summary
from decentralized_verl.reporting.metrics import MetricsLog, read_evals
from decentralized_verl.reporting.stats import difference_interval, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(26, 100, 0.1840, 0.3537), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (100, 200, 0.4313, 0.5687)],
)
def test_wilson_interval_matches_worked_values(k: int, n: int, low: float, high: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=2e-4)
    assert 0.0 <= got[0] <= k / n <= got[1] <= 1.0


def test_wilson_interval_narrows_with_more_problems_and_refuses_bad_counts() -> None:
    small, large = wilson_interval(10, 33), wilson_interval(60, 200)
    assert large[1] - large[0] < small[1] - small[0]
    with pytest.raises(ValueError, match="n: must be >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"successes: must be in \[0, 5\]"):
        wilson_interval(6, 5)


def evaluation(step: int, correct: int, n: int = 200) -> dict:
    low, high = wilson_interval(correct, n)
    return {"step": step, "eval_accuracy": correct / n, "eval_accuracy_low": low, "eval_accuracy_high": high,
            "eval_problems": n, "eval_reward_mean": correct / n}  # fmt: skip


def test_evaluations_go_to_eval_jsonl_and_a_repeated_step_keeps_the_last(tmp_path: Path) -> None:
    with MetricsLog(tmp_path / "metrics.jsonl") as log:
        log.write({"step": 1, "reward_mean": 0.1})
        for row in (evaluation(0, 52), evaluation(10, 70), evaluation(10, 71), evaluation(20, 90)):
            log.write_eval(row)
    rows = read_evals(tmp_path / "eval.jsonl")
    assert [r["step"] for r in rows] == [0, 10, 20] and rows[1]["eval_accuracy"] == 71 / 200
    assert all("time" in r for r in rows)
    ends = eval_ends(tmp_path / "eval.jsonl")
    assert ends["eval_accuracy_before"] == 0.26 and ends["eval_accuracy_after"] == 0.45
    assert ends["eval_interval_before"] == pytest.approx(list(wilson_interval(52, 200)))
    assert eval_ends(tmp_path / "missing.jsonl") is None
    line = format_summary(
        {"steps": 20, "seconds": 61.0, "reward_first": 0.1, "reward_last": 0.3, **ends}, tmp_path
    )
    assert "eval accuracy 26.0% [20.4-32.5] -> 45.0% [38.3-51.9] on 200 problems, 95% intervals" in line
    low, high = difference_interval((52, 200), (90, 200))
    assert ends["eval_gain"] == pytest.approx(0.19)
    assert ends["eval_gain_interval"] == pytest.approx([low, high])
    assert f"gain +19.0 points [{100 * low:+.1f}, {100 * high:+.1f}]" in line


def test_difference_interval_matches_newcombes_worked_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, table II example (56/70 vs 48/80): method 10 gives
    # 0.0524 to 0.3339 for p1 - p2 = 0.2.
    low, high = difference_interval((48, 80), (56, 70))
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    assert difference_interval((5, 10), (5, 10))[0] < 0 < difference_interval((5, 10), (5, 10))[1]
    # Equal counts on a larger set: a narrower interval around 0; a real gain excludes 0.
    small, large = difference_interval((30, 100), (30, 100)), difference_interval((240, 800), (240, 800))
    assert large[1] - large[0] < small[1] - small[0]
    assert difference_interval((62, 240), (100, 240))[0] > 0


def test_plot_draws_the_step_zero_evaluation_with_its_band(tmp_path: Path) -> None:
    rows = [{"step": s, "reward_mean": 0.1 * s, "eval_accuracy": 0.9 if s == 2 else None} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in (evaluation(0, 52), evaluation(3, 80)))
    )
    written = plot_run(tmp_path)
    assert tmp_path / "plots" / "eval_accuracy.png" in written
    assert (tmp_path / "plots" / "eval_accuracy.png").stat().st_size > 1000
    records = [*rows, evaluation(0, 52), evaluation(3, 80)]
    steps, low, high = _interval_band(records, "eval_accuracy")
    assert steps == [0, 3] and low[0] == pytest.approx(wilson_interval(52, 200)[0]) and high[1] > low[1]
    assert _interval_band(rows, "reward_mean") is None
