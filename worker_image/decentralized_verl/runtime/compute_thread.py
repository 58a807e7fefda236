"""One long-lived thread for a process's torch compute.

torch's CPU kernels run on OpenMP (libgomp), and libgomp gives every thread that starts parallel work its
own team of pool threads, kept for the life of that thread. Once a process holds more such threads than it
has cores, libgomp stops spinning between parallel regions and puts idle workers to sleep at once, so each
of the thousands of small ops of a decode step waits for a wake-up. Measured on 2 cores: the same 64-row
SmolLM2 decode took 2.2 s while one thread had ever computed and 3.2 s once a second one had (a
decode-like loop of small matmuls and elementwise ops, `benchmarks/cpu_kernels.py`: 0.36 vs 0.68 s).
A colocated job used a fresh thread per generation call and another for each update, so every step
after the first ran slow.

So the compute of one process (model loading, generation, the learner's update, colocated scoring) goes
through ``call`` / ``run``, which execute on a single thread; a call made on that thread runs inline. Work
queued here runs one item at a time, which is what the cores can do anyway. A compute process hands it a
`thread_governor.ThreadGovernor` (`govern`), which sizes torch's threads before each item to the cores
other programs leave free.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_thread_id: int | None = None
_governor: Governor | None = None


class Governor(Protocol):
    def begin(self) -> None: ...
    def end(self) -> None: ...


def govern(governor: Governor | None) -> None:
    """Call ``governor.begin()`` / ``end()`` around each work item from now on (None: stop)."""
    global _governor
    _governor = governor


def _forget() -> None:
    """In a forked child the thread does not exist: start afresh on first use."""
    global _executor, _thread_id, _lock
    _executor, _thread_id, _lock = None, None, threading.Lock()


def _item(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    governor = _governor
    if governor is None:
        return fn(*args, **kwargs)
    governor.begin()
    try:
        return fn(*args, **kwargs)
    finally:
        governor.end()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _mark() -> None:
    global _thread_id
    _thread_id = threading.get_ident()


def executor() -> ThreadPoolExecutor:
    """The process's compute executor (one worker thread, started on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="torch-compute", initializer=_mark)
        return _executor


def on_compute_thread() -> bool:
    return _thread_id is not None and threading.get_ident() == _thread_id


def submit(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """Queue ``fn`` on the compute thread (not for calls made from it: they would wait on themselves)."""
    if on_compute_thread():
        raise RuntimeError("compute_thread.submit: called on the compute thread; call the function directly")
    return executor().submit(_item, fn, *args, **kwargs)


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the compute thread, waiting for it (inline when already there)."""
    if on_compute_thread():
        return fn(*args, **kwargs)
    return submit(fn, *args, **kwargs).result()


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` for coroutines: the event loop keeps running while the compute thread works."""
    if on_compute_thread():
        return fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(_item, fn, *args, **kwargs))
