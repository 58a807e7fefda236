"""The process's compute thread: one thread for all torch work, inline when already on it.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os

import pytest

from decentralized_verl.runtime import compute_thread


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_gets_a_thread_of_its_own() -> None:
    compute_thread.call(lambda: None)  # the parent's thread exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: would wait forever on the parent's (absent) thread without the fork hook
        ok = compute_thread.call(lambda: 42) == 42
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
