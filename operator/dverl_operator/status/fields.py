"""Pure: the `.status` fields a pass fills in: each role's ready, desired and restarted workers, the
printer column, and the coordinator's progress."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from decentralized_verl.core.status import JobStatus
from dverl_operator.objects.pod_state import pod_deleting, pod_ready, role_of


def role_counts(
    desired: Mapping[str, int], pods: Iterable[Mapping[str, Any]], restarts: Mapping[str, int]
) -> dict[str, dict[str, int]]:
    """Per role: ready pods (not being deleted), desired pods, restarts so far."""
    ready: dict[str, int] = dict.fromkeys(desired, 0)
    for pod in pods:
        role = role_of(pod)
        if role in ready and pod_ready(pod) and not pod_deleting(pod):
            ready[role] += 1
    return {
        role: {"ready": ready[role], "desired": count, "restarts": int(restarts.get(role, 0))}
        for role, count in desired.items()
    }


def workers_column(roles: Mapping[str, Mapping[str, int]]) -> str:
    ready = sum(r["ready"] for r in roles.values())
    desired = sum(r["desired"] for r in roles.values())
    return f"{ready}/{desired}"


def progress_fields(progress: JobStatus) -> dict[str, Any]:
    """The `.status` fields (camelCase) the coordinator's reported progress sets; the step's numbers
    (reward, KL, tokens/s) only once a step has finished."""
    out: dict[str, Any] = {
        "step": progress.step,
        "totalSteps": progress.total_steps,
        "policyVersion": progress.policy_version,
        "volunteers": progress.volunteers,
    }
    reported = progress.reported
    for key, value in (
        ("reward", progress.reward_mean if reported else None),
        ("kl", progress.kl if reported else None),
        ("tokensPerSecond", progress.tokens_per_second if reported else None),
        ("lastCheckpoint", progress.last_checkpoint or None),
        ("evalAccuracy", progress.eval_accuracy),
    ):
        if value is not None:
            out[key] = round(value, 6) if isinstance(value, float) else value
    parity = progress.refit_parity
    if parity is not None:
        out["refitParity"] = {
            "meanAbsDiff": _significant(parity.diff_mean),
            "maxAbsDiff": _significant(parity.diff_max),
            "version": parity.version,
            "tokens": parity.tokens,
        }
    return out


def _significant(value: float) -> float:
    """Four significant digits: parity spans 1e-7 (fp32 on one machine) to whole nats (a broken refresh),
    so rounding to fixed decimals would show a healthy refresh as 0."""
    return float(f"{value:.4g}")


def newly_blocked(previous_count: int, progress: JobStatus) -> list[tuple[str, str]]:
    """Peers blocked since the count in `.status` was written (the coordinator lists them in order).

    `.status.blockedPeers` is a job-lifetime counter: it never goes down, so a learner restart (whose
    blocklist starts empty) does not make the operator announce the same peers twice.
    """
    return list(progress.blocked_peers[previous_count:])
