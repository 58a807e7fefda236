"""Pure: what a failed reconcile pass is, and how long the job's loop waits before the next one.

A failure to reach or be answered by the API server (a timeout, a refused connection, an error status) is
the cluster's and is tried again soon; anything else is a bug in a pass, logged with its traceback and tried
again at the next resync, so one bad job never silences its loop. This is where failures are told apart by
kind; the pod restart backoff of a job's workers is a decision of the reconcile (pods/decisions.py), not a
retry of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from dverl_operator.kube.errors import ApiError

API_RETRY_SECONDS = 2.0
"""How soon a pass the API server failed is tried again (never later than the resync)."""


@dataclass(frozen=True)
class Failure:
    kind: str
    """The metric label: the exception's type."""
    from_cluster: bool
    """The API server failed or could not be reached (else: a bug in the pass)."""
    retry_after: float


def classify(exc: BaseException, resync_seconds: float) -> Failure:
    from_cluster = isinstance(exc, TimeoutError | ApiError | OSError)
    delay = min(API_RETRY_SECONDS, resync_seconds) if from_cluster else resync_seconds
    return Failure(kind=type(exc).__name__, from_cluster=from_cluster, retry_after=delay)
