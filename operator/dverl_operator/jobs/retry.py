"""Pure: what a failed reconcile pass is, and how long the job's loop waits before the next one.

A failure to reach or be answered by the API server (a timeout, a refused connection, an error status) is
the cluster's and is tried again soon; a create the API server refused is the job's (its status says
it) and is tried again with exponential backoff; anything else is a bug in a pass, logged with its
traceback and tried again at the next resync, so one bad job never silences its loop. This is where failures
are told apart by
kind; the pod restart backoff of a job's workers is a decision of the reconcile (pods/decisions.py), not a
retry of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from dverl_operator.kube.errors import ApiError
from dverl_operator.pods.decisions import backoff_delay

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


def refused_retry(attempts: int, base_seconds: float, max_seconds: float) -> float:
    """How long after the `attempts`-th pass in a row whose creates the API server refused the job is
    tried again: base, 2*base, 4*base, ... capped, as a pod's restarts back off. Admission, quota and
    validation change only when a person or another controller acts, so asking every second only loads
    the API server."""
    return backoff_delay(max(attempts, 1), base_seconds, max_seconds)
