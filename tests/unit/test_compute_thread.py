"""The process's compute thread: one thread for all torch work, inline when already on it.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from decentralized_verl.runtime import compute_thread


def test_calls_from_other_threads_all_land_on_one_thread() -> None:
    seen = {compute_thread.call(threading.get_ident) for _ in range(5)}
    seen |= {asyncio.run(compute_thread.run(threading.get_ident))}
    others: list[int] = []
    workers = [
        threading.Thread(target=lambda: others.append(compute_thread.call(threading.get_ident)))
        for _ in range(3)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seen |= set(others)
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_a_call_made_on_the_compute_thread_runs_inline_and_submit_refuses() -> None:
    def nested() -> tuple[bool, int]:
        return compute_thread.on_compute_thread(), compute_thread.call(lambda: 7)

    assert compute_thread.call(nested) == (True, 7)
    assert not compute_thread.on_compute_thread()
    with pytest.raises(RuntimeError, match="called on the compute thread"):
        compute_thread.call(compute_thread.submit, print)


def test_errors_reach_the_caller_and_the_thread_lives_on() -> None:
    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        compute_thread.call(boom)
    with pytest.raises(ValueError, match="boom"):
        asyncio.run(compute_thread.run(boom))
    assert compute_thread.call(lambda: 1 + 1) == 2
