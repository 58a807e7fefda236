"""The coordinator's side of refit parity: which rollout workers' samples disagree with the learner after a
refresh, and failing the job by name when the disagreement passes `training.refitParityBound`.

The numbers come from the update (`training/refit_parity.py`); this turns them into a verdict naming
both sides and the policy version whose refresh went wrong, so that a person reads in one line which
worker to look at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from decentralized_verl.core.samples import Sample
from decentralized_verl.core.status import RefitParity
from decentralized_verl.errors import OperationFailed


class RefitParityError(OperationFailed):
    """A weight refresh whose rollout log-probs disagree with the learner's beyond the spec's bound."""


def fresh_rows(samples: Sequence[Sample], version: int) -> list[bool]:
    """Rows generated wholly by policy `version`, the weights the learner holds: only those are compared."""
    return [s.policy_version == version and all(part[1] == version for part in s.parts) for s in samples]


def worst_by_worker(
    samples: Sequence[Sample], row_max: Sequence[float], rows: Sequence[int]
) -> dict[str, float]:
    """Each rollout worker's largest per-token difference over its compared rows (`rows[i]` is the batch
    row `row_max[i]` belongs to)."""
    worst: dict[str, float] = {}
    for row, value in zip(rows, row_max, strict=False):
        if math.isnan(value):
            continue
        worker = samples[row].worker_id or "an unnamed rollout worker"
        worst[worker] = max(worst.get(worker, 0.0), value)
    return worst


def measured_parity(metrics: dict[str, Any], version: int) -> RefitParity | None:
    """The step's parity as the Status RPC reports it (the refresh to `version`); None when the step
    compared no tokens (every row stale, or nothing updated)."""
    mean = metrics.get("refit_logprob_diff_mean")
    if mean is None:
        return None
    return RefitParity(
        diff_mean=float(mean),
        diff_max=float(metrics.get("refit_logprob_diff_max", mean)),
        version=version,
        tokens=int(metrics.get("refit_parity_tokens", 0)),
    )


def check_refit(
    metrics: dict[str, Any],
    *,
    bound: float | None,
    samples: Sequence[Sample],
    row_max: Sequence[float],
    rows: Sequence[int],
    version: int,
    learner: str,
) -> None:
    """Raise `RefitParityError` when the step's mean difference passes `bound`, naming the rollout workers
    whose rows differ most, the learner and the version; nothing when within it, unmeasured or unbounded."""
    mean = metrics.get("refit_logprob_diff_mean")
    if bound is None or mean is None or mean <= bound:
        return
    worst = sorted(worst_by_worker(samples, row_max, rows).items(), key=lambda kv: -kv[1])
    named = ", ".join(f"{w} (max {d:.3g})" for w, d in worst[:4]) or "rollout workers on other learner ranks"
    raise RefitParityError(
        f"refit parity failed after the refresh to policy version {version}: rollout {named} and learner "
        f"{learner} disagree on the same tokens by {mean:.4g} nats per token on average (max "
        f"{metrics.get('refit_logprob_diff_max', float('nan')):.4g}), over training.refitParityBound "
        f"{bound:g}; the weights the rollout loaded are not the learner's"
    )
