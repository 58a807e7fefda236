"""What this process trusts, decided once at its edge: the job credentials it was started with
(DVERL_TLS_DIR) and the key that checks the weights it receives.

A worker of the job holds the credentials, so its channels, servers and weight receivers use them without
being told. A volunteer holds none: the coordinator that admits it hands it the job's weight key, which it
passes to its weight source explicitly. A process with neither (one component used as a library, a unit
test) talks plaintext and accepts unsigned weights.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from decentralized_verl.security import handed
from decentralized_verl.security.credentials import JobCredentials, load
from decentralized_verl.settings import env_name

if TYPE_CHECKING:
    from decentralized_verl.settings import WorkerSettings

SECRETS_FD_VARIABLE = env_name("secrets_fd")
"""Set by `dverl run` alone (not a user setting): the socket this process reads its role's token and a
learner's signing key from, once, at its entry, so they are never on disk nor in the environment."""
PROCESS_KEY = object()
"""Default for a `key=` argument: whatever this process trusts (resolved when used)."""


@functools.cache
def _load(folder: str) -> JobCredentials:
    """Once per folder, with the secrets the entry took from its launcher (`security.handed`), if any."""
    return load(Path(folder), handed.taken())


_given: str | None = None
"""The credentials folder the process entry handed over; nothing until it does."""


def adopt(settings: WorkerSettings) -> None:
    """The process entry hands over where this process's credentials are (DVERL_TLS_DIR; the secrets
    handed on DVERL_SECRETS_FD were taken before anything else ran); they are loaded when first used."""
    global _given
    _given = settings.tls_dir


def process_credentials() -> JobCredentials | None:
    """The credentials this process was started with, or None when it was given none."""
    return _load(_given) if _given else None


def weights_signing_key() -> bytes | None:
    """The private key that signs published weights: the learner's only."""
    creds = process_credentials()
    return creds.signing_key if creds is not None else None


def weights_verify_key() -> bytes | None:
    """The key every received weight manifest must be signed with; None accepts unsigned weights."""
    creds = process_credentials()
    return creds.verify_key if creds is not None else None
