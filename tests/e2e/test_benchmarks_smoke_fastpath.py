"""Smoke runs of the fast-path benchmarks (grpo_vs_trl, learner_mfu, cpu_kernels, cpu_sharing,
time_to_accuracy) at tiny sizes.

Each script runs as a real subprocess and its JSON report is checked against what the sizes imply
(hand-counted FLOPs, budgets, curves). TRL's side, installed with the dev extras, runs too: a `trl`
that does not import fails its tests.

Here the jobs that train end to end; the pure checks in tests/unit/; the ones with real processes and
servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.benchmark_runs import TINY_SMOKE_PARAMS
from tests.support.benchmark_runs import run_benchmark as run
from tests.support.paths import BENCHMARKS as BENCH

sys.path.insert(0, str(BENCH))

import _common


def report_of(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def grpo_report() -> dict:
    return report_of(run("grpo_vs_trl.py", "--tiny", "--threads", "1", "--shots", "2"))


def test_grpo_vs_trl_ours_side(grpo_report: dict) -> None:
    model = grpo_report["models"]["tiny-smoke"]
    assert grpo_report["settings"]["completions_per_step"] == 8  # --tiny: 2 prompts x 4 samples
    ours = model["sides"]["ours"]
    assert len(ours["steps_s"]) == 1 and ours["median_step_s"] > 0
    profile = ours["profile_median_s"]
    assert all(v >= 0 for v in profile.values())
    assert profile["generation"] > 0 and profile["backward"] > 0 and profile["forward_loss"] > 0
    # The phases are measured separately; only other_idle is the remainder, so they cannot exceed the step.
    measured = sum(v for k, v in profile.items() if k != "other_idle")
    assert measured <= ours["median_step_s"] * 1.01
    assert ours["settings"]["gradient_checkpointing"] is False
    assert model["parameters"] == TINY_SMOKE_PARAMS
    # two demos: the prompt is the one-shot prompt plus one more exchange, far longer than 8 new tokens
    from decentralized_verl.models.tokenizer import build_char_tokenizer

    one_shot = _common.median([len(p.token_ids) for p in _common.arithmetic_prompts(build_char_tokenizer())])
    assert model["shots"] == 2 and model["prompt_tokens_median"] > one_shot + 20


def test_grpo_vs_trl_trl_side(grpo_report: dict) -> None:
    model = grpo_report["models"]["tiny-smoke"]
    assert not model["trl_skipped"], f"TRL side not run: {model['trl_skipped']}"
    ours = model["sides"]["ours"]["median_step_s"]
    for variant, checkpointing in (("matched", False), ("default", True)):
        side = model["sides"][f"trl-{variant}"]
        assert side["median_step_s"] > 0
        assert side["settings"]["gradient_checkpointing"] is checkpointing
        assert side["settings"]["beta"] == 0.0 and side["settings"]["num_generations"] == 4
        ratio = model["ratios"][f"trl-{variant}"]
        assert ratio["ratio_of_medians"] == pytest.approx(side["median_step_s"] / ours)
        assert side["profile_median_s"]["generation"] > 0


def test_learner_mfu_smoke() -> None:
    report = report_of(run("learner_mfu.py", "--tiny", "--threads", "1"))
    both = report["models"]["tiny-smoke"]
    assert set(both) == {"plain", "shared", "speedup"}
    assert both["speedup"] == pytest.approx(both["shared"]["tokens_per_s"] / both["plain"]["tokens_per_s"])
    assert both["shared"]["tokens"] == both["plain"]["tokens"]  # the same batch, two forwards
    result = both["shared"]
    # Hand count: 8 rows (2 prompts x 4 samples); each row is its prompt plus 8 response tokens.
    from decentralized_verl.models.tokenizer import build_char_tokenizer

    prompts = _common.arithmetic_prompts(build_char_tokenizer(), limit=2)
    tokens = sum(4 * (len(p.token_ids) + 8) for p in prompts)
    assert result["tokens"] == tokens and result["rows"] == 8
    assert result["flops_6nt"] == 6 * TINY_SMOKE_PARAMS * tokens
    assert result["flops_model"] > 6 * result["body_parameters"] * tokens
    assert len(result["update_s"]) == 2 and all(t > 0 for t in result["update_s"])
    assert result["achieved_gflops_6nt"] == pytest.approx(
        result["flops_6nt"] / result["median_update_s"] / 1e9
    )
    assert result["ceiling_before"]["bfloat16"]["median_gflops"] > 0
    # Against the ceiling of the dtype the model computes in: a CPU without bf16 units (AVX2 only) runs bf16
    # matmuls ~50x slower than fp32, so an fp32 model's MFU "vs bf16" says nothing there.
    own = f"mfu_6nt_vs_{result['dtype']}"
    assert 0 < result[own] < 5  # a loaded machine can depress the ceiling, not invert it


def test_learner_mfu_packs_the_shared_side_into_the_plain_micro_batch_memory() -> None:
    out = run("learner_mfu.py", "--tiny", "--threads", "1", "--shared-microbatch-tokens", "plain")
    report = report_of(out)
    both = report["models"]["tiny-smoke"]
    assert both["plain"]["microbatch_tokens"] is None  # the plain forward keeps its rows per micro-batch
    # 1 prompt x 4 samples a plain micro-batch, each row padded to the batch's width
    assert both["shared"]["microbatch_tokens"] == 4 * both["plain"]["padded_length"]


def test_cpu_kernels_smoke() -> None:
    report = report_of(run("cpu_kernels.py", "--tiny", "--threads", "1", "--repeats", "2"))
    cases = report["attention"]
    assert {c["dtype"] for c in cases} == {"bfloat16", "float32"}
    assert {c["pass"] for c in cases} == {"forward + backward", "forward"}
    for case in cases:
        assert case["sdpa_ms"] > 0 and case["grouped_ms"] > 0
        assert case["speedup"] == pytest.approx(case["sdpa_ms"] / case["grouped_ms"])
    teams = report["openmp_teams"]
    assert teams["slowdown"] == pytest.approx(teams["two_teams_s"] / teams["one_team_s"])
    assert "| SDPA ms |" in report["markdown"]


def test_cpu_sharing_smoke() -> None:
    report = report_of(run("cpu_sharing.py", "--smoke", timeout=300))
    assert report["steps"] == 4 and list(report["runs"]) == ["governed/none"]
    (wall,) = report["runs"]["governed/none"]
    assert wall > 0 and report["median_s"] == {"governed/none": wall}


def test_time_to_accuracy_smoke(tmp_path: Path) -> None:
    out = run("time_to_accuracy.py", "--tiny", "--threads", "1", "--out-dir", str(tmp_path), timeout=300)
    report = report_of(out)
    assert report["eval_prompts"] == 4 and report["budget_s"] == 4.0
    lines = [json.loads(x) for x in (tmp_path / "curves.jsonl").read_text().splitlines()]
    expected = {"ours"} if report["trl_skipped"] else {"ours", "trl"}
    assert {p["side"] for p in lines} == {f"{side}/seed0" for side in expected}
    for side in expected:
        points = [p for p in lines if p["side"] == f"{side}/seed0"]
        assert points[0]["step"] == 0 and points[0]["accuracy"] == report["start_accuracy"]
        times = [p["train_s"] for p in points]
        assert times == sorted(times) and times[-1] >= 4.0  # trains until the budget is spent
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in points)
        summary = report["sides"][side]
        assert summary["seeds"] == [0] and summary["steps"] == [points[-1]["step"]]
        assert summary["final_accuracy"] == [points[-1]["accuracy"]]
        reached = [p for p in points if p["accuracy"] >= report["target"] - 1e-9]
        assert summary["time_to_target_s"] == [reached[0]["train_s"] if reached else None]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not report["trl_skipped"], f"TRL side not run: {report['trl_skipped']}"
