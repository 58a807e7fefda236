"""torch's thread count follows the cores other processes leave free: parsing, the decision, the
governor's measurement over work items (scripted clocks), and a real process beside a real busy one.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest

from decentralized_verl.runtime import compute_thread
from decentralized_verl.runtime.thread_governor import (
    ThreadGovernor,
    busy_jiffies,
    others_busy_cores,
    threads_for,
)

STAT = """cpu  900 0 300 5000 10 0 5 0 0 0
cpu0 100 1 50 2000 7 2 3 4 0 0
cpu1 200 0 60 3000 3 0 1 0 0 0
intr 12345
ctxt 999
"""


def test_busy_time_sums_the_cores_asked_for_without_idle_or_iowait() -> None:
    assert busy_jiffies(STAT, {0}) == 100 + 1 + 50 + 2 + 3 + 4
    assert busy_jiffies(STAT, {0, 1}) == 160 + 200 + 60 + 1
    assert busy_jiffies(STAT, {1, 7}) == 261  # a core not listed adds nothing
    assert busy_jiffies(STAT, {5}) is None
    assert busy_jiffies("", {0}) is None
    with pytest.raises(ValueError):
        busy_jiffies("cpu0 1 2 x\n", {0})


def test_others_are_what_the_machine_did_beyond_this_process() -> None:
    assert others_busy_cores(2.0, 1.0, 1.0) == 1.0
    assert others_busy_cores(1.0, 1.2, 1.0) == 0.0  # jiffy rounding never goes below zero
    assert others_busy_cores(1.0, 0.0, 0.0) == 0.0


@pytest.mark.parametrize(
    ("ceiling", "cores", "others", "threads"),
    [
        (2, 2, 0.0, 2),
        (2, 2, 0.25, 2),  # a little noise keeps every thread
        (2, 2, 0.5, 1),  # half a core taken: a thread there would hold up every barrier
        (2, 2, 1.0, 1),
        (2, 2, 2.0, 1),  # never below one
        (4, 64, 40.0, 4),  # a pod's quota on a busy node: the quota is the bound
        (4, 64, 62.0, 2),
        (8, 8, 3.2, 5),  # a fourth core 0.2 busy still counts as free
        (8, 8, 3.4, 4),
    ],
)
def test_threads_are_the_free_cores_within_the_ceiling(ceiling, cores, others, threads) -> None:
    assert threads_for(ceiling, cores, others) == threads


class Machine:
    """A scripted machine: two cores, this process's CPU clock, and whether a rival computes."""

    def __init__(self) -> None:
        self.now = 0.0
        self.own = 0.0
        self.ready = 0.0
        self.jiffies = 0
        self.set_to: list[int] = []
        self.readable = True

    def stat(self) -> str:
        if not self.readable:
            raise OSError("no /proc")
        return f"cpu0 {self.jiffies} 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n"

    def item(
        self,
        governor: ThreadGovernor,
        *,
        seconds: float,
        own_cores: float,
        rival_cores: float,
        ready_cores: float = 0.0,
    ) -> None:
        """One work item: this process computes on `own_cores` and stands ready, kept off a core, on
        `ready_cores` more, while a rival computes on `rival_cores`."""
        governor.begin()
        self.now += seconds
        self.own += own_cores * seconds
        self.ready += ready_cores * seconds
        self.jiffies += round((own_cores + rival_cores) * seconds * governor.hz)
        governor.end()


class GovernorOn(ThreadGovernor):
    """The governor of a two-core machine whose I/O edges are `machine`'s."""

    def __init__(self, machine: Machine) -> None:
        super().__init__(2, {0, 1})
        self.machine = machine

    def read_stat(self) -> str:
        return self.machine.stat()

    def set_threads(self, threads: int) -> None:
        self.machine.set_to.append(threads)

    def clock(self) -> float:
        return self.machine.now

    def cpu_clock(self) -> float:
        return self.machine.own

    def ready_clock(self) -> float:
        return self.machine.ready


def governor_on(machine: Machine) -> ThreadGovernor:
    return GovernorOn(machine)


def test_a_rival_process_takes_a_thread_away_and_gives_it_back() -> None:
    machine = Machine()
    governor = governor_on(machine)
    for _ in range(10):  # alone: this process's own two busy cores are never held against it
        machine.item(governor, seconds=0.1, own_cores=2.0, rival_cores=0.0)
    assert governor.threads == 2 and machine.set_to == []
    for _ in range(4):  # a rival computes on one core
        machine.item(governor, seconds=0.1, own_cores=1.3, rival_cores=0.7)
    machine.item(governor, seconds=0.1, own_cores=1.0, rival_cores=1.0)
    assert governor.threads == 1 and machine.set_to == [1]
    for _ in range(20):  # it stops
        machine.item(governor, seconds=0.1, own_cores=1.0, rival_cores=0.0)
    assert governor.threads == 2 and machine.set_to == [1, 2]


def test_short_idle_and_waiting_items_move_nothing() -> None:
    machine = Machine()
    governor = governor_on(machine)
    for _ in range(50):  # waiting on the network while a sibling process computes: not measured
        machine.item(governor, seconds=0.1, own_cores=0.1, rival_cores=2.0)
    machine.item(governor, seconds=0.2, own_cores=1.0, rival_cores=1.0)  # under one window
    governor.begin()
    assert governor.threads == 2 and machine.set_to == []
    governor.end()
    machine.readable = False  # no /proc: the governor stands aside
    for _ in range(10):
        machine.item(governor, seconds=0.1, own_cores=1.0, rival_cores=1.0)
    assert governor.threads == 2


def test_a_process_starved_by_others_is_measured_and_gives_up_a_thread() -> None:
    """Kept off its cores by a machine full of other work, the process computes little but is ready to
    compute all the time: that is contention, not waiting on the network."""
    machine = Machine()
    governor = governor_on(machine)
    for _ in range(5):
        machine.item(governor, seconds=0.1, own_cores=0.2, rival_cores=1.8, ready_cores=1.5)
    assert governor.threads == 1 and machine.set_to == [1]


def test_ready_clock_reads_this_process_run_delay() -> None:
    governor = ThreadGovernor(2, {0})
    first = governor.ready_clock()
    assert first >= 0.0 and governor.ready_clock() >= first


def test_compute_thread_calls_the_governor_around_each_item() -> None:
    seen: list[str] = []

    class Recorder:
        def begin(self) -> None:
            seen.append("begin")

        def end(self) -> None:
            seen.append("end")

    compute_thread.govern(Recorder())
    try:
        assert compute_thread.call(lambda: seen.append("work") or 7) == 7
        with pytest.raises(ZeroDivisionError):
            compute_thread.call(lambda: 1 / 0)
        assert compute_thread.call(lambda: compute_thread.call(lambda: 3)) == 3  # nested: inline, once
    finally:
        compute_thread.govern(None)
    assert seen == ["begin", "work", "end", "begin", "end", "begin", "end"]
