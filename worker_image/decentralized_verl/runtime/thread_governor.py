"""torch's thread count follows the cores that other processes leave free.

A process's pool is sized at start from the cores it may use (`cpus`), but nothing reserves those cores:
another program on the machine (a build, a second job, a noisy neighbour outside the pod's cpuset) can
take some of them. OpenMP then runs more threads than there are free cores, and every parallel region
ends at a barrier that waits for a thread the scheduler has parked behind the other program. Measured on
2 cores with one busy single-thread process beside the tiny example: 177 s for 50 steps with 2 threads a
process against 5 s with 1 (5 s idle too), a 35x slowdown for half the machine.

So the compute thread measures, while it computes, how busy the cores it may run on are with work that is
not its process's own (the machine's busy time on those cores from ``/proc/stat`` minus this process's CPU
time), and before the next work item sets torch's thread count to the cores left: its ceiling (what
`cpus` gave it) when the machine is otherwise quiet, fewer while something else computes. Its own
threads, spinning or working, are never counted against it, so the count does not chase its own load.
Measured only during its own work: a sibling process of the same job that computed in the phase before
is not mistaken for a competitor.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
SELF_TASKS = Path("/proc/self/task")
WINDOW_S = 0.3
"""Compute time gathered before the estimate moves: jiffies are 10 ms, so shorter windows are noise."""
SPARE = 0.3
"""Other processes' use below this (in cores, past whole ones) leaves a core free. Low, because a thread
that shares its core with a busy process holds up every barrier, while one thread too few costs at most
that thread's share."""
MIN_UTILISATION = 0.5
"""Items whose process used, or stood ready to use, less than this many cores on average (waiting on the
network, not computing) are not measured: the point is the cores free while this process computes. Time
its threads spent runnable but kept off a core counts as wanting to compute: a process starved by others
is the one that most needs fewer threads, and by its CPU time alone it would look idle."""
SMOOTHING = 0.5
"""Weight of the newest window in the estimate of other processes' busy cores (the first is taken whole)."""


def busy_jiffies(stat_text: str, cpus: Collection[int]) -> int | None:
    """Busy time (all but idle and iowait) summed over the ``cpuN`` lines of ``/proc/stat`` for ``cpus``;
    None when none of them is listed."""
    total, seen = 0, False
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            index = int(name[3:])
        except ValueError:
            continue
        if index not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
        total += sum(fields[:3]) + sum(fields[5:8])
        seen = True
    return total if seen else None


def others_busy_cores(machine_busy_s: float, own_cpu_s: float, wall_s: float) -> float:
    """Cores' worth of work by other processes over a window (never below zero)."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, (machine_busy_s - own_cpu_s) / wall_s)


def threads_for(ceiling: int, cores: int, others_busy: float) -> int:
    """Threads to run with: the cores others leave free (see ``SPARE``), within [1, ceiling]."""
    free = math.floor(cores - others_busy + SPARE)
    return max(1, min(ceiling, free))


@dataclass
class _Window:
    machine_busy_s: float = 0.0
    own_cpu_s: float = 0.0
    wall_s: float = 0.0


class ThreadGovernor:
    """`begin` before and `end` after each work item on the compute thread (`compute_thread.govern`).

    Its I/O edges are the five methods at the end: the machine's per-core busy time (``/proc/stat``),
    torch's pool and the three clocks."""

    def __init__(self, ceiling: int, cpus: Collection[int]) -> None:
        self.ceiling = max(1, ceiling)
        self.cpus = frozenset(cpus)
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.others_busy = 0.0
        self.windows = 0
        self.threads = self.ceiling
        self._window = _Window()
        self._start: tuple[int, float, float, float] | None = None

    def begin(self) -> None:
        wanted = threads_for(self.ceiling, len(self.cpus), self.others_busy)
        if wanted != self.threads:
            log.info(
                "other processes keep %.1f of %d cores busy: computing on %d threads (was %d)",
                self.others_busy,
                len(self.cpus),
                wanted,
                self.threads,
            )
            self.set_threads(wanted)
            self.threads = wanted
        busy = self._busy()
        self._start = None if busy is None else (busy, self.cpu_clock(), self.clock(), self.ready_clock())

    def end(self) -> None:
        if self._start is None:
            return
        busy0, cpu0, t0, ready0 = self._start
        self._start = None
        busy = self._busy()
        if busy is None:
            return
        own, wall = self.cpu_clock() - cpu0, self.clock() - t0
        if wall <= 0 or own + (self.ready_clock() - ready0) < MIN_UTILISATION * wall:
            return
        w = self._window
        w.machine_busy_s += (busy - busy0) / self.hz
        w.own_cpu_s += own
        w.wall_s += wall
        if w.wall_s >= WINDOW_S:
            latest = others_busy_cores(w.machine_busy_s, w.own_cpu_s, w.wall_s)
            weight = SMOOTHING if self.windows else 1.0
            self.others_busy = weight * latest + (1 - weight) * self.others_busy
            self.windows += 1
            self._window = _Window()

    def _busy(self) -> int | None:
        try:
            return busy_jiffies(self.read_stat(), self.cpus)
        except (OSError, ValueError):
            return None

    def read_stat(self) -> str:
        return PROC_STAT.read_text()

    def set_threads(self, threads: int) -> None:
        import torch  # noqa: PLC0415 light: torch; `dverl run`'s supervisor imports this module

        torch.set_num_threads(threads)

    def clock(self) -> float:
        return time.monotonic()

    def cpu_clock(self) -> float:
        return time.process_time()

    def ready_clock(self) -> float:
        """Seconds this process's threads have spent runnable, waiting for a core (the kernel's run
        delay, ``/proc/self/task/*/schedstat``); 0 where the kernel does not keep it."""
        total = 0
        for task in SELF_TASKS.glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended between the listing and the read
        return total / 1e9


def for_this_process(ceiling: int) -> ThreadGovernor | None:
    """A governor over this process's CPUs when the machine reports per-core busy time (Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
        if busy_jiffies(PROC_STAT.read_text(), cpus) is None:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return ThreadGovernor(ceiling, cpus)
