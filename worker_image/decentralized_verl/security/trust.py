"""What this process trusts, decided once at its edge: the job credentials it was started with
(DVERL_TLS_DIR) and the key that checks the weights it receives.

A worker of the job holds the credentials, so its channels, servers and weight receivers use them without
being told. A volunteer holds none: the coordinator that admits it hands it the job's weight key, which it
passes to its weight source explicitly. A process with neither (one component used as a library, a unit
test) talks plaintext and accepts unsigned weights.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from decentralized_verl.security.credentials import JobCredentials, load, read_handed

SECRETS_FD_VARIABLE = "DVERL_SECRETS_FD"
"""Set by `dverl run` alone (not a user setting): the pipe this process reads its role's token and a
learner's signing key from, once, at start, so they are never on disk nor in the environment."""
PROCESS_KEY = object()
"""Default for a `key=` argument: whatever this process trusts (resolved when used)."""


@functools.cache
def _load(folder: str, secrets_fd: int | None) -> JobCredentials:
    """Once per (folder, pipe): a handed pipe can be read only once."""
    return load(Path(folder), read_handed(secrets_fd) if secrets_fd is not None else None)


def process_credentials() -> JobCredentials | None:
    """The credentials this process was started with, or None when it was given none."""
    from decentralized_verl.settings import WorkerSettings

    folder = WorkerSettings.from_env().tls_dir
    handed = os.environ.get(SECRETS_FD_VARIABLE)
    return _load(folder, int(handed) if handed else None) if folder else None


def weights_signing_key() -> bytes | None:
    """The private key that signs published weights: the learner's only."""
    creds = process_credentials()
    return creds.signing_key if creds is not None else None


def weights_verify_key() -> bytes | None:
    """The key every received weight manifest must be signed with; None accepts unsigned weights."""
    creds = process_credentials()
    return creds.verify_key if creds is not None else None
