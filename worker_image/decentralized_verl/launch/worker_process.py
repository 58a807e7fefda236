"""Starting one worker process the way every executor does: its own session, output to its log file, and
the role's secrets (token, the learner's signing key) through one end of a Unix socket pair the child
reads first thing at its entry (`security.handed`), never a file, the environment or a pipe, which every
process of this user can read (a pipe through `/proc/<pid>/fd/<n>`; a socket cannot be opened there)."""

from __future__ import annotations

import os
import socket
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours:
            ours.sendall(secrets)  # a few hundred bytes: the socket's buffer holds them
            ours.shutdown(socket.SHUT_WR)
        environment[SECRETS_FD_VARIABLE] = str(theirs.fileno())
        handed = (theirs.detach(),)
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
