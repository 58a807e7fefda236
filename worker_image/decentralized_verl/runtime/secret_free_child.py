"""A child process for user code that holds none of its parent's secrets: no `DVERL_*` variable (tokens,
keys and seeds travel in those or over the launcher's socket, never inherited), no inherited descriptor,
a fresh interpreter that shares only the import path."""

from __future__ import annotations

import os
import subprocess
import sys


def start_secret_free_child(module: str, *, text: bool) -> subprocess.Popen:
    """`python -m module` talking over its stdin and stdout pipes, nothing else of this process passed on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVERL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=text,
        close_fds=True,
    )
