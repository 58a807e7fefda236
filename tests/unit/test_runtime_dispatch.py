"""Dispatch: throughput-weighted shares, re-dispatch after failures, every item answered exactly once.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest

from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.orchestration.dispatch import Dispatcher, NoWorkersLeft, split_by_weight
from tests.support.fake_workers import FakeRollout, items


@pytest.mark.parametrize(
    ("n", "weights", "expected"),
    [
        (10, [1, 1], [5, 5]),
        (10, [3, 1], [8, 2]),
        (7, [1, 1, 1], [3, 2, 2]),
        (2, [100, 1, 1], [2, 0, 0]),
        (3, [100, 1, 1], [1, 1, 1]),
    ],
)
def test_split_by_weight(n, weights, expected):
    counts = split_by_weight(n, weights)
    assert sum(counts) == n
    assert sorted(counts, reverse=True) == sorted(expected, reverse=True)


async def test_failed_worker_items_are_redispatched_exactly_once():
    broken = FakeRollout("broken", fail_after=3)
    good = FakeRollout("good")
    dispatcher = Dispatcher([broken, good])
    work = items(5, 4)
    samples, report = await dispatcher.run(work, SamplingParams(max_new_tokens=4), version=0)
    keys = [s.key for s in samples]
    assert sorted(keys) == sorted((p.prompt_id, k) for p, k in work)
    assert len(keys) == len(set(keys))
    assert report.redispatched == 10 - 3
    assert any("connection reset" in f for f in report.failures)
    by_worker = {}
    for s in samples:
        by_worker[s.worker_id] = by_worker.get(s.worker_id, 0) + 1
    assert by_worker == {"broken": 3, "good": 17}


async def test_garbage_answers_fail_the_worker_and_all_workers_failing_raises():
    dispatcher = Dispatcher([FakeRollout("liar", garbage=True)])
    with pytest.raises(NoWorkersLeft, match="liar: answered an item it was not given"):
        await dispatcher.run(items(2, 2), SamplingParams(max_new_tokens=4), version=0)
