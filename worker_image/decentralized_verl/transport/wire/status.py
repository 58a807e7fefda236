"""The Status RPC's reply <-> `core.status.JobStatus`, validated on arrival wherever it is read."""

from __future__ import annotations

import re

from decentralized_verl.core.status import JobStatus, RefitParity
from decentralized_verl.transport.wire.common import (
    WireError,
    _check_finite,
    _check_nonempty_text,
    _optional,
    pb,
)

FAILURE_CHARS = 4000
"""The most a failure's text may say: it becomes a condition's message."""
REASON_WORD = re.compile(r"[A-Z][A-Za-z]{0,63}")
"""A condition reason as the operator writes them (CamelCase, one word)."""


def job_status_to_proto(s: JobStatus) -> pb.JobStatus:
    msg = pb.JobStatus(
        step=s.step,
        total_steps=s.total_steps,
        phase=s.phase,
        state=s.state,
        reward_mean=s.reward_mean,
        reward_std=s.reward_std,
        kl=s.kl,
        response_length_mean=s.response_length_mean,
        policy_version=s.policy_version,
        tokens_per_second=s.tokens_per_second,
        phase_seconds=dict(s.phase_seconds),
        last_checkpoint=s.last_checkpoint,
        volunteers=s.volunteers,
        blocked_peers=[pb.BlockedPeer(peer_id=p, reason=r) for p, r in s.blocked_peers],
        failure=s.failure,
        failure_reason=s.failure_reason,
    )
    if s.eval_accuracy is not None:
        msg.eval_accuracy = s.eval_accuracy
    if s.refit_parity is not None:
        p = s.refit_parity
        msg.refit_parity.CopyFrom(
            pb.RefitParity(diff_mean=p.diff_mean, diff_max=p.diff_max, version=p.version, tokens=p.tokens)
        )
    return msg


def refit_parity_from_proto(msg: pb.JobStatus) -> RefitParity | None:
    """The reply's refit parity, checked: finite, non-negative differences, the max at least the mean, a
    version the job has reached."""
    if not msg.HasField("refit_parity"):
        return None
    p = msg.refit_parity
    for name in ("diff_mean", "diff_max"):
        _check_finite(getattr(p, name), f"refit_parity.{name}", minimum=0.0)
    if (
        p.diff_max + 1e-9 * max(1.0, p.diff_mean) < p.diff_mean
    ):  # rounding aside, a mean is never above its max
        raise WireError("refit_parity.diff_max", f"{p.diff_max} is below diff_mean {p.diff_mean}")
    if p.version > msg.policy_version:
        raise WireError(
            "refit_parity.version", f"{p.version} is newer than the policy_version {msg.policy_version}"
        )
    return RefitParity(diff_mean=p.diff_mean, diff_max=p.diff_max, version=p.version, tokens=p.tokens)


def job_status_from_proto(msg: pb.JobStatus) -> JobStatus:
    """Validate a Status reply: finite numbers, non-negative durations, accuracy in [0, 1]."""
    _check_nonempty_text(msg.state, "state")
    if msg.total_steps and msg.step > msg.total_steps:
        raise WireError("step", f"{msg.step} exceeds total_steps {msg.total_steps}")
    for name in ("reward_mean", "reward_std", "kl", "response_length_mean", "tokens_per_second"):
        _check_finite(getattr(msg, name), name)
    for name in ("reward_std", "response_length_mean", "tokens_per_second"):
        _check_finite(getattr(msg, name), name, minimum=0.0)
    for key in sorted(msg.phase_seconds):
        _check_finite(msg.phase_seconds[key], f"phase_seconds[{key!r}]", minimum=0.0)
    accuracy = _optional(msg, "eval_accuracy")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise WireError("eval_accuracy", f"must be in [0, 1] (got {accuracy})")
    for i, peer in enumerate(msg.blocked_peers):
        _check_nonempty_text(peer.peer_id, f"blocked_peers[{i}].peer_id")
    parity = refit_parity_from_proto(msg)
    if len(msg.failure) > FAILURE_CHARS:
        raise WireError("failure", f"has {len(msg.failure)} characters, at most {FAILURE_CHARS}")
    if msg.failure_reason and not REASON_WORD.fullmatch(msg.failure_reason):
        raise WireError("failure_reason", f"must be one word of letters (got {msg.failure_reason[:40]!r})")
    return JobStatus(
        step=msg.step,
        total_steps=msg.total_steps,
        phase=msg.phase,
        state=msg.state,
        reward_mean=msg.reward_mean,
        reward_std=msg.reward_std,
        kl=msg.kl,
        response_length_mean=msg.response_length_mean,
        policy_version=msg.policy_version,
        tokens_per_second=msg.tokens_per_second,
        phase_seconds=tuple(sorted(msg.phase_seconds.items())),
        last_checkpoint=msg.last_checkpoint,
        eval_accuracy=accuracy,
        volunteers=msg.volunteers,
        blocked_peers=tuple((p.peer_id, p.reason) for p in msg.blocked_peers),
        refit_parity=parity,
        failure=msg.failure,
        failure_reason=msg.failure_reason,
    )
