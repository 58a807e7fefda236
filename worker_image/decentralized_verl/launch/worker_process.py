"""Starting one worker process the way every executor does: its own session, output to its log file, and
the role's secrets (token, the learner's signing key) through a pipe the child reads once at start, never
a file and never the environment, both readable by every process of this user."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from decentralized_verl.security.trust import SECRETS_FD_VARIABLE


def start_worker(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path, secrets: bytes | None
) -> subprocess.Popen:
    environment = dict(env)
    handed: tuple[int, ...] = ()
    if secrets is not None:
        read_end, write_end = os.pipe()
        os.write(write_end, secrets)
        os.close(write_end)
        environment[SECRETS_FD_VARIABLE] = str(read_end)
        handed = (read_end,)
    try:
        with log_path.open("ab") as log_file:
            return subprocess.Popen(
                list(argv),
                env=environment,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=handed,
            )
    finally:
        for fd in handed:
            os.close(fd)
