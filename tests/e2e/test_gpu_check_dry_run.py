"""The GPU check's dry run on the CPU: every part runs in its own process at test sizes and reports real
numbers, and the check's own machinery (a part over its budget, a failing part, bad arguments) answers as
the GPU run will rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def check(out: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )


@pytest.mark.timeout(1500)  # thirteen parts, each in its own processes, on a machine others share
def test_every_part_passes_the_cpu_dry_run(tmp_path: Path) -> None:
    done = check(tmp_path, "--budget-scale", "6")
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "gpu_check.log").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = {part["name"]: part for part in summary["parts"]}
    assert set(parts) == {
        "matmul_peak", "shared_prompt_forward", "grouped_attention", "chunked_logprobs", "fsdp2_checkpoint",
        "weight_refresh", "qlora", "gpu_tests", "tiny_job", "smollm2_job", "every_role_job",
        "one_gpu_colocated", "grpo_side_by_side", "learner_alone",
    }  # fmt: skip
    assert all(part["status"] == "passed" for part in parts.values()), summary
    forward = parts["shared_prompt_forward"]["by_dtype"]
    assert forward["float32"]["logprob_max_abs"] <= 1e-4 and forward["float32"]["grad_rel"] <= 1e-4
    assert parts["fsdp2_checkpoint"]["process_group_backend"] == "gloo"
    assert (
        parts["fsdp2_checkpoint"]["restored_weights_equal"] and parts["fsdp2_checkpoint"]["third_step_equal"]
    )
    assert parts["weight_refresh"]["changed_by_refresh"]
    assert (
        parts["qlora"]["adapters_only_refresh_max_abs"] <= 1e-4
        and not parts["qlora"]["adapters_without_grad"]
    )
    assert parts["tiny_job"]["steps"] == 6 and parts["smollm2_job"]["steps"] == 2
    # every role's worker said which device it chose and what it holds there: the CPU and nothing
    every = parts["every_role_job"]
    assert set(every["roles"]) == {"rollout", "reference", "critic", "reward"} and all(
        every["roles_ok"].values()
    )
    assert all(r["device"] == "cpu" and r["memory_allocated"] == 0 for r in every["roles"].values())
    assert every["steps"] == 3 and all(d is not None and d < 1e-3 for d in every["refit_logprob_diff_mean"])
    one = parts["one_gpu_colocated"]
    assert one["steps"] == 3 and one["machine"] == "no GPU" and set(one["devices"].values()) == {"cpu"}
    side = parts["grpo_side_by_side"]
    assert side["sides"]["ours"]["median_step_s"] > 0 and side["learner_tokens_per_s"] > 0
    assert side["learner_mfu"] > 0 and side["peak_tflops"] == parts["matmul_peak"]["median_tflops"]
    if "trl-matched" in side["sides"]:
        assert side["ratio_trl_over_ours"] > 0
    assert parts["learner_alone"]["tokens_per_s"] > 0 and parts["learner_alone"]["mfu_6nt"] > 0
    log = (tmp_path / "gpu_check.log").read_text()
    assert "skipped" in parts["gpu_tests"]["summary"]  # no CUDA here: each skips, saying so
    assert log.count("=====") == len(parts)  # every part's output is kept, in order
    assert f"[{len(parts)}/{len(parts)}] learner_alone: passed" in done.stdout


def test_a_part_over_its_budget_is_killed_and_fails_the_check(tmp_path: Path) -> None:
    done = check(tmp_path, "--parts", "tiny_job", "--budget-scale", "0.001")
    assert done.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["parts"][0]["status"] == "timeout" and summary["crashed"] == ["tiny_job"]
    assert not summary["passed"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--parts", "nonsense"], "--parts: unknown ['nonsense']"),
        (["--device", "tpu"], "--device: cuda or cpu"),
    ],
)
def test_bad_arguments_name_the_flag(tmp_path: Path, args: list[str], message: str) -> None:
    done = check(tmp_path, *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_cuda_on_a_machine_without_one_is_refused(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
