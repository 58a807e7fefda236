"""Pure: creates the API server refused, as the job's status says them.

A create can be refused for reasons no retry of the same object soon mends: Pod Security admission or an
RBAC rule (403 Forbidden), a ResourceQuota (403 with "exceeded quota"), validation (422 Invalid), an
admission webhook's denial (any 4xx with its message). Each becomes the job's `CreateRefused` condition
and a Warning Event that name the object, its role and the API server's own words, so `kubectl get
rlhfjobs` and `kubectl describe` show why nothing runs; the loop tries again with exponential backoff
(jobs/retry.py), and the condition goes once a pass creates what it wants without one refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dverl_operator.objects import quoting
from dverl_operator.status.conditions import CREATE_REFUSED, condition, drop_condition, set_condition

Status = dict[str, Any]
Events = list[tuple[str, str, str]]
REFUSED_STATUSES = range(400, 500)
"""Answers that refuse the object itself (409 AlreadyExists aside, which a create treats as done)."""
EVENTS_AT_MOST = 5
"""Refusals announced at once: a large job's many pods refused for one reason say it a few times only."""


@dataclass(frozen=True)
class Refusal:
    """One create the API server refused: what, for which role, and what the server said."""

    kind: str
    name: str
    role: str | None
    status: int
    reason: str
    """The Kubernetes reason of the answer (Forbidden, Invalid, ...)."""
    message: str

    @property
    def cause(self) -> str:
        """The condition's reason: what kind of refusal, told from the answer."""
        text = self.message.lower()
        if self.status == 403 and "exceeded quota" in text:
            return "QuotaExceeded"
        if self.status == 403 and "podsecurity" in text:
            return "PodSecurityRefused"
        if "admission webhook" in text and "denied" in text:
            return "WebhookDenied"
        return self.reason or f"HTTP{self.status}"

    def __str__(self) -> str:
        role = f" ({self.role})" if self.role else ""
        said = quoting.head(self.message, quoting.LONG)
        server = f"HTTP {self.status} {self.reason}"
        return f"{self.kind} {self.name}{role} refused by the API server: {server}: {said}"


def is_refusal(status: int) -> bool:
    return status in REFUSED_STATUSES and status != 409


def with_refusals(
    status: Mapping[str, Any], refusals: Sequence[Refusal], attempts: int, retry_in: float, now: float
) -> tuple[Status, Events]:
    """The status after a pass whose creates were refused (`attempts` passes in a row, the next in
    `retry_in` seconds), or, with none refused, the condition gone. Events when the refusal is new or
    its words changed: one repeated unchanged at each backoff is not announced again."""
    conditions = list(status.get("conditions") or [])
    if not refusals:
        if condition(conditions, CREATE_REFUSED) is None:
            return dict(status), []
        new = {**status, "conditions": drop_condition(conditions, CREATE_REFUSED)}
        if str(new.get("message") or "").startswith("refused: "):
            new["message"] = ""
        return new, []
    first = refusals[0]
    more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
    message = f"{first}{more}; attempt {attempts}, next in {retry_in:.3g}s"
    previous = condition(conditions, CREATE_REFUSED)
    events: Events = []
    if previous is None or str(first) not in str(previous.get("message") or ""):
        events = [("Warning", CREATE_REFUSED, str(r)) for r in refusals[:EVENTS_AT_MOST]]
    conditions = set_condition(conditions, CREATE_REFUSED, "True", first.cause, message, now)
    return {**status, "conditions": conditions, "message": f"refused: {first}{more}"}, events
