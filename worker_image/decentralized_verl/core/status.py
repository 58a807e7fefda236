"""The job's progress: one type from the training loop to the operator's `.status`.

The coordinator keeps the current `JobStatus` on a `StatusBoard` and replaces it as the step moves; the
Status RPC sends a copy over the wire (`transport.wire.status`), and every reader (the operator, the
progress bar of `dverl run`) gets the same type back, validated on arrival. Pure: no gRPC, no torch, so
the operator can import it.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RefitParity:
    """How far the rollout's log-probs were from the learner's on the same tokens after the refresh to
    `version` (`training/refit_parity.py` measures it): what a person checks when rewards look wrong."""

    diff_mean: float
    """Mean absolute difference per compared token, in nats."""
    diff_max: float
    """The largest absolute difference of any compared token."""
    version: int
    """The policy version whose refresh was compared."""
    tokens: int = 0
    """Tokens compared."""


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of training progress."""

    step: int = 0
    total_steps: int = 0
    phase: str = "starting"
    state: str = "Pending"
    reward_mean: float = 0.0
    reward_std: float = 0.0
    kl: float = 0.0
    response_length_mean: float = 0.0
    policy_version: int = 0
    tokens_per_second: float = 0.0
    phase_seconds: tuple[tuple[str, float], ...] = ()
    """(phase, seconds) of the last step, sorted by phase."""
    last_checkpoint: str = ""
    eval_accuracy: float | None = None
    volunteers: int = 0
    blocked_peers: tuple[tuple[str, str], ...] = ()
    """(peer id, reason) in blocking order; the operator counts them and raises an Event for each."""
    refit_parity: RefitParity | None = None
    """The latest refit parity measured; None before the first (or when no step compared fresh rows)."""
    failure: str = ""
    """With state Failed: why, naming what to look at (a refit-parity verdict names the workers)."""
    failure_reason: str = ""
    """With state Failed: the failure's kind as one word (a Kubernetes condition reason); empty: unsaid."""

    @property
    def reported(self) -> bool:
        """Whether a step has finished, so the step's numbers (reward, KL, tokens/s) mean something."""
        return self.step > 0


class StatusBoard:
    """The coordinator's current `JobStatus`, replaced whole on every change (readers never see half an
    update). The loop, the volunteer hub and the Status RPC share one board; thread-safe."""

    def __init__(self, status: JobStatus | None = None) -> None:
        self._status = status or JobStatus()
        self._lock = threading.Lock()

    @property
    def current(self) -> JobStatus:
        return self._status

    def update(self, **changes: object) -> JobStatus:
        with self._lock:
            self._status = dataclasses.replace(self._status, **changes)
            return self._status

    def block(self, peer_id: str, reason: str) -> None:
        """Record a blocked volunteer once, keeping the blocking order."""
        with self._lock:
            if any(peer == peer_id for peer, _ in self._status.blocked_peers):
                return
            blocked = (*self._status.blocked_peers, (peer_id, reason))
            self._status = dataclasses.replace(self._status, blocked_peers=blocked)
