"""The secrets a launcher hands a worker (its role's token, a learner's signing key, the DHT bootstrap's
seed), taken once, first thing at the process's entry, before any other code of the process runs.

Three things keep them from every other process of the same user:
- they come over one end of a Unix socket pair (`launch/worker_process.start_worker`), which no other
  process can open through `/proc/<pid>/fd/<n>` (a pipe can be opened that way by any process allowed
  to read the worker's `/proc`; a socket cannot);
- the process makes itself non-dumpable before it reads them, so from then on no process without
  CAP_SYS_PTRACE can read its memory (`/proc/<pid>/mem`, ptrace) or even list its descriptors;
- it refuses to read them while another process traces it (one that attached before it became
  non-dumpable would keep its access).

Root (CAP_SYS_PTRACE) is beyond this: see docs/trust.md for what the threat model covers.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from decentralized_verl.security.credentials import CredentialsError, read_handed

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

_taken: bytes | None = None


def make_undumpable() -> None:
    """No process of this user without CAP_SYS_PTRACE may read this process's memory or descriptors
    from now on (and it leaves no core dump). Children it execs are dumpable again: they hold none of
    its memory."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise CredentialsError(f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(ctypes.get_errno())}")


def is_dumpable() -> bool:
    return bool(ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def tracer_pid(status: str | None = None) -> int:
    """The pid tracing this process (0: none), from /proc/self/status."""
    text = Path("/proc/self/status").read_text() if status is None else status
    for line in text.splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


def take(fd: int | None) -> bytes | None:
    """At the entry: when a launcher handed this process secrets on `fd` (`DVERL_SECRETS_FD`), become
    non-dumpable, refuse if traced, read them and close the descriptor. Later calls (None) return what
    was taken."""
    global _taken
    if fd is None:
        return _taken
    make_undumpable()
    traced_by = tracer_pid()
    if traced_by:
        os.close(fd)
        raise CredentialsError(
            f"process {traced_by} traces this worker: it would read the secrets handed to it; refused"
        )
    _taken = read_handed(fd)
    return _taken


def taken() -> bytes | None:
    """The secrets `take` read at the entry, if any."""
    return _taken
