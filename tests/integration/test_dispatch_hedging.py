"""Hedging: a share far past its worker's usual time is also given to a worker that is done, so a worker
cut off mid-share (a partition, a collapsed link) holds the step seconds, not until its deadline; a worker
that is slow as usual is left alone; whichever answer comes first is kept, the other dropped, none lost."""

from __future__ import annotations

import asyncio

import pytest

from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.orchestration import hedging
from decentralized_verl.orchestration.dispatch import Dispatcher
from tests.support.fake_workers import FakeRollout, items


class GoesSilent(FakeRollout):
    """Answers normally until `silent` is set, then stops after `after` items of a share, holding its stream
    open (as a partitioned peer does); records whether its stream was cancelled."""

    def __init__(self, worker_id: str, delay: float, after: int) -> None:
        super().__init__(worker_id, delay)
        self.silent = False
        self.after = after
        self.cancelled = False

    async def generate(self, items, sampling, version):
        try:
            n = 0
            async for sample in super().generate(items, sampling, version):
                if self.silent and n >= self.after:
                    await asyncio.Event().wait()
                n += 1
                yield sample
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@pytest.fixture(autouse=True)
def short_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hedging, "HEDGE_FLOOR_S", 0.3)


async def test_a_worker_gone_silent_is_hedged_and_nothing_is_lost_or_doubled() -> None:
    steady, silent = FakeRollout("steady", delay=0.005), GoesSilent("silent", delay=0.005, after=2)
    dispatcher = Dispatcher([steady, silent])
    work = items(6, 4)
    sampling = SamplingParams(max_new_tokens=4)
    await dispatcher.run(work, sampling, version=0)  # both measured
    silent.silent = True
    samples, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=1), 20)
    keys = [s.key for s in samples]
    assert sorted(keys) == sorted((p.prompt_id, k) for p, k in work) and len(set(keys)) == len(keys)
    assert report.hedged == report.assigned["silent"] - 2  # all but the two it answered
    assert report.failures == [] and report.redispatched == 0  # late, not failed: it stays in dispatch
    assert silent.cancelled  # its stream was closed once every item was in
    assert sum(s.worker_id == "silent" for s in samples) == 2
    silent.silent = False
    _, report = await dispatcher.run(work, sampling, version=2)
    assert "silent" not in report.assigned  # one step on probation after a late share
    _, report = await dispatcher.run(work, sampling, version=3)
    assert report.hedged == 0 and report.assigned["silent"] > 0  # then back, and on time


async def test_a_worker_that_stays_late_sits_out_longer_each_time() -> None:
    steady, silent = FakeRollout("steady", delay=0.002), GoesSilent("silent", delay=0.002, after=0)
    dispatcher = Dispatcher([steady, silent])
    work = items(3, 2)
    sampling = SamplingParams(max_new_tokens=4)
    await dispatcher.run(work, sampling, version=0)
    silent.silent = True
    used = []
    for version in range(1, 9):
        samples, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=version), 20)
        assert len({s.key for s in samples}) == len(work) and report.failures == []
        used.append("silent" in report.assigned)
    # late at 1; out 1 step; late at 3; out 2; late at 6; out 4 (probation doubles while it stays late)
    assert used == [True, False, True, False, False, True, False, False]


def test_probation_doubles_and_is_capped() -> None:
    assert [hedging.probation_steps(n) for n in range(6)] == [0, 1, 2, 4, 8, 8]
    assert hedging.late_after(None) is None and hedging.late_after(10.0) == 30.0


async def test_a_worker_slow_as_usual_is_not_hedged() -> None:
    fast, slow = FakeRollout("fast", delay=0.001), FakeRollout("slow", delay=0.05)
    dispatcher = Dispatcher([fast, slow])
    work = items(4, 4)
    sampling = SamplingParams(max_new_tokens=4)
    for version in range(3):
        samples, report = await dispatcher.run(work, sampling, version=version)
        assert report.hedged == 0 and len({s.key for s in samples}) == len(work)
        assert report.assigned["slow"] >= 1  # it keeps its (small) share every step


async def test_a_late_answer_that_wins_is_kept_and_the_hedge_dropped() -> None:
    class SlowsDown(FakeRollout):
        async def generate(self, items, sampling, version):
            self.delay = 0.005 if version == 0 else 1.0  # 200x its usual pace, but it does answer
            async for sample in super().generate(items, sampling, version):
                yield sample

    class Sluggish(FakeRollout):
        async def generate(self, items, sampling, version):
            self.delay = 0.001 if len(self.calls) < 2 else 3.0  # the hedge itself is slower still
            async for sample in super().generate(items, sampling, version):
                yield sample

    late, helper = SlowsDown("late", 0.005), Sluggish("helper", 0.001)
    dispatcher = Dispatcher([late, helper])
    work = items(2, 4)
    sampling = SamplingParams(max_new_tokens=4)
    await dispatcher.run(work, sampling, version=0)
    samples, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=1), 30)
    assert len({s.key for s in samples}) == len(samples) == len(work)
    assert report.hedged > 0 and report.failures == []
    # the late worker beat its (slower) hedge on every item it was given: its answers are the ones kept
    assert sum(s.worker_id == "late" for s in samples) == report.assigned["late"]


async def test_a_worker_whose_stream_ends_after_its_last_answer_keeps_its_place() -> None:
    """On a busy machine the end of a worker's stream can come well after its last answer: the step ends
    without it, and the worker, which was on time, is neither benched nor hedged."""

    class SlowToClose(FakeRollout):
        def __init__(self, worker_id: str) -> None:
            super().__init__(worker_id)
            self.hold, self.answered = False, asyncio.Event()

        async def generate(self, items, sampling, version):
            async for sample in super().generate(items, sampling, version):
                yield sample
            if self.hold:
                self.answered.set()
                await asyncio.Event().wait()  # the stream's end, still on its way

    class FinishesAfter(FakeRollout):
        def __init__(self, worker_id: str, after: asyncio.Event) -> None:
            super().__init__(worker_id)
            self.after, self.hold = after, False

        async def generate(self, items, sampling, version):
            async for sample in super().generate(items, sampling, version):
                yield sample
            if self.hold:
                await self.after.wait()

    closing = SlowToClose("closing")
    other = FinishesAfter("other", closing.answered)
    dispatcher = Dispatcher([closing, other])
    work = items(4, 2)
    sampling = SamplingParams(max_new_tokens=4)
    await dispatcher.run(work, sampling, version=0)  # both measured
    closing.hold = other.hold = True
    samples, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=1), 20)
    assert len({s.key for s in samples}) == len(work) and report.failures == [] and report.hedged == 0
    assert sum(s.worker_id == "closing" for s in samples) == report.assigned["closing"] > 0
    closing.hold = other.hold = False
    _, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=2), 20)
    assert report.assigned["closing"] > 0  # not on probation: it was on time


async def test_waiting_for_a_late_share_wakes_the_dispatcher_a_few_times_not_in_a_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between a worker finishing its share and another's share coming due for a hedge, the dispatcher
    sleeps until that moment: it does not wake again and again on the finished share's time, long past
    (which spun a core of the learner for the whole wait)."""
    monkeypatch.setattr(hedging, "HEDGE_FLOOR_S", 0.01)  # each share late at 3x its own usual time
    # Shares are sized by speed, but items are whole: the slow worker's one item is due for a hedge
    # later than the fast worker's three (before, about 18,000 wake-ups in that gap; now 3).
    steady, silent = FakeRollout("steady", delay=0.001), GoesSilent("silent", delay=0.05, after=0)
    dispatcher = Dispatcher([steady, silent])
    work = items(2, 2)
    sampling = SamplingParams(max_new_tokens=4)
    await dispatcher.run(work, sampling, version=0)  # both measured
    silent.silent = True
    waits = 0
    real_wait = asyncio.wait

    async def counted(*args, **kwargs):
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counted)
    samples, report = await asyncio.wait_for(dispatcher.run(work, sampling, version=1), 20)
    assert len({s.key for s in samples}) == len(work) and report.hedged > 0
    assert waits < 50, f"the dispatcher woke {waits} times while it waited to hedge"
