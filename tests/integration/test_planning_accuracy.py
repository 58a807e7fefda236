"""The planner's numbers against real training: the activation count against the tensors autograd saves
(tiny models, each case of the count), and the learner estimate against the peak resident memory a real
policy update adds (a 56M-parameter Llama, in a subprocess).

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import sys

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import plan_accuracy


def test_learner_estimate_within_25_percent_of_a_real_update() -> None:
    result = plan_accuracy.run_case("tiny-llama512", timeout=600)
    assert abs(result.weights_estimated / result.weights_measured - 1) < 0.25, result
    assert 0.75 < result.ratio < 1.25, plan_accuracy.table([result])
