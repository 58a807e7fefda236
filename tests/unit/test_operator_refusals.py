"""The API server's refusals as the job's status, told apart by kind, announced once, cleared when gone."""

from __future__ import annotations

import pytest

from dverl_operator.jobs.retry import refused_retry
from dverl_operator.status import conditions as cond
from dverl_operator.status.refusals import Refusal, is_refusal, with_refusals

NOW = 1_800_000_000.0
QUOTA = (
    'pods "j-learner-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, '
    "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4"
)


@pytest.mark.parametrize(
    ("status", "reason", "message", "cause"),
    [
        (403, "Forbidden", QUOTA, "QuotaExceeded"),
        (
            403,
            "Forbidden",
            'pods "x" is forbidden: violates PodSecurity "restricted:latest": ...',
            "PodSecurityRefused",
        ),
        (400, "BadRequest", 'admission webhook "vpod.kb.io" denied the request: no', "WebhookDenied"),
        (422, "Invalid", 'Pod "x" is invalid: spec.containers[0].image: Required value', "Invalid"),
        (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:d:op" cannot create', "Forbidden"),
    ],
)
def test_a_refusal_is_told_apart_by_what_the_server_said(status, reason, message, cause) -> None:
    assert Refusal("Pod", "x", "learner", status, reason, message).cause == cause


def test_only_answers_about_the_object_are_refusals() -> None:
    assert [s for s in (400, 403, 404, 409, 422, 429, 500, 503) if is_refusal(s)] == [400, 403, 404, 422, 429]


def test_the_condition_and_event_name_the_object_its_role_and_the_servers_words() -> None:
    refusal = Refusal("Pod", "j-learner-0", "learner", 403, "Forbidden", QUOTA)
    other = Refusal("Pod", "j-rollout-0", "rollout", 403, "Forbidden", QUOTA.replace("learner", "rollout"))
    status, events = with_refusals({"phase": "Pending"}, [refusal, other], 1, 10.0, NOW)
    found = cond.condition(status["conditions"], cond.CREATE_REFUSED)
    assert found is not None and found["reason"] == "QuotaExceeded"
    assert found["message"] == (
        f"Pod j-learner-0 (learner) refused by the API server: HTTP 403 Forbidden: {QUOTA} (and 1 more); "
        "attempt 1, next in 10s"
    )
    assert status["message"].startswith("refused: Pod j-learner-0 (learner)")
    assert [e[1] for e in events] == ["CreateRefused", "CreateRefused"]
    assert "Pod j-rollout-0 (rollout)" in events[1][2]
    again, quiet = with_refusals(status, [refusal, other], 2, 20.0, NOW + 10)
    assert quiet == []
    assert "attempt 2, next in 20s" in cond.condition(again["conditions"], cond.CREATE_REFUSED)["message"]
    later = cond.condition(again["conditions"], cond.CREATE_REFUSED)
    assert later is not None and later["lastTransitionTime"] == found["lastTransitionTime"]
    cleared, none = with_refusals(again, [], 3, 40.0, NOW + 30)
    assert cond.condition(cleared["conditions"], cond.CREATE_REFUSED) is None and none == []
    assert cleared["message"] == ""


def test_refused_passes_back_off_exponentially_to_a_cap() -> None:
    assert [refused_retry(n, 5.0, 60.0) for n in range(1, 7)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
