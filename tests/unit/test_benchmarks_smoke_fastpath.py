"""Smoke runs of the fast-path benchmarks (grpo_vs_trl, learner_mfu, cpu_kernels, cpu_sharing,
time_to_accuracy) at tiny sizes.

Each script runs as a real subprocess and its JSON report is checked against what the sizes imply
(hand-counted FLOPs, budgets, curves). TRL's side, installed with the dev extras, runs too: a `trl`
that does not import fails its tests.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.paths import BENCHMARKS as BENCH

sys.path.insert(0, str(BENCH))

import _common
import _trl
import grpo_vs_trl

# tiny-smoke by hand: 2 layers x (attention 4*64*64 + MLP 3*64*128 + 2 norms of 64) + embedding and
# untied lm_head 2*104*64 + final norm 64.
TINY_SMOKE_PARAMS = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 104 * 64 + 64
assert TINY_SMOKE_PARAMS == 95_552


def test_helpers_by_hand() -> None:
    settings = _common.GRPOSettings(prompts_per_step=8, samples_per_prompt=8, microbatch_prompts=2)
    assert (settings.completions, settings.microbatch_rows, settings.accumulation) == (64, 16, 4)
    with pytest.raises(ValueError, match="multiple of microbatch_prompts"):
        _ = _common.GRPOSettings(prompts_per_step=8, microbatch_prompts=3).accumulation
    assert _common.markdown_table(["a", "b"], [[1, 0.12345]]) == "| a | b |\n|---|---|\n| 1 | 0.123 |"
    curve = _common.Curve("x", [{"accuracy": 0.2, "train_s": 1.0}, {"accuracy": 0.5, "train_s": 9.0}])
    assert curve.reached(0.5)["train_s"] == 9.0 and curve.reached(0.6) is None
    assert _common.boxed_score("so \\boxed{12}", "12") == 1.0
    assert _common.boxed_score("12", "12") == 0.0  # no box, no reward
    kwargs = _trl.trl_config_kwargs(settings, _trl.TRL_VARIANTS["matched"], "/tmp/x", 5)
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 64
    assert kwargs["gradient_checkpointing"] is False and kwargs["bf16"] is False
    demos = _common.few_shot(3)
    assert len(demos) == 6 and demos[:2] == _common.FEW_SHOT and "\\boxed{57}" in demos[3]["content"]
    with pytest.raises(ValueError, match="shots must be"):
        _common.few_shot(0)
    assert grpo_vs_trl.target_ratio(75, 32) == 3.0 and grpo_vs_trl.target_ratio(20, 32) == 2.5
