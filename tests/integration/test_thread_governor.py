"""torch's thread count follows the cores other processes leave free: parsing, the decision, the
governor's measurement over work items (scripted clocks), and a real process beside a real busy one.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

RIVAL = "while True: pass"

WORKER = textwrap.dedent(
    """
    import os, torch
    os.environ["DVERL_CPUS"] = "2"
    from decentralized_verl.runtime import compute_thread
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.settings import WorkerSettings
    configure_from_environment(WorkerSettings.from_env())
    a = torch.randn(256, 256)
    def work():
        b = a
        for _ in range(200):
            b = torch.tanh(b @ a)
        return torch.get_num_threads()
    seen = [compute_thread.call(work) for _ in range(12)]
    print(seen[0], seen[-1])
    """
)


TWO_CORES = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not TWO_CORES or not os.path.exists("/proc/stat"), reason="two cores, /proc/stat")
def test_a_real_process_computes_on_one_thread_beside_a_busy_one() -> None:
    cores = sorted(os.sched_getaffinity(0))[:2]
    rival = subprocess.Popen([sys.executable, "-c", RIVAL])
    try:
        os.sched_setaffinity(rival.pid, {cores[1]})
        # The worker pins itself, then execs: a preexec_fn would make this process fork(), and a fork of
        # a process whose gRPC threads are busy (earlier tests' servers) can abort in the child.
        pinned = (
            f"import os, sys; os.sched_setaffinity(0, {set(cores)!r}); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        worker = subprocess.run(
            [sys.executable, "-c", pinned, "-c", WORKER],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        rival.kill()
        rival.wait()
    assert worker.returncode == 0, worker.stderr[-2000:]
    first, last = worker.stdout.split()
    assert (first, last) == ("2", "1"), worker.stderr[-2000:]
