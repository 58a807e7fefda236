"""The hub's admission state on disk: what a block and a redemption leave there, taken up by a resumed
learner's hub, and a file that is not this job's admission state refused by name (starting without the
blocks it holds would let a blocked volunteer back in)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers.admission import VolunteerAdmissionError
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.tokens import issue_token

SECRET = b"admission-state-secret-" * 2
JOB = "state-job"


def hub() -> VolunteerHub:
    return VolunteerHub(HubConfig(job=JOB, secret=SECRET), dispatcher=None)


def test_a_block_and_its_token_survive_into_a_resumed_hub(tmp_path: Path) -> None:
    path = tmp_path / "admission.json"
    first = hub()
    first.keep_admission(path, restore=False)
    tok = issue_token(SECRET, JOB, 600)
    assert first.admit(m.JoinRequest(JOB, tok, "rollout", "cpu", 1.0), "peer-a").accepted
    first.block("peer-a", "verification failed")
    again = hub()
    again.keep_admission(path, restore=True)
    assert again.blocked == {"peer-a": "verification failed"}
    reply = again.admit(m.JoinRequest(JOB, tok, "rollout", "cpu", 1.0), "peer-b")
    assert not reply.accepted and "this join token is blocked" in reply.reason
    assert [h["joins"] for h in again.token_history.values()] == [1]


def test_a_fresh_run_starts_empty_and_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "admission.json"
    path.write_text(json.dumps({"format": 1, "job": JOB, "redeemed": {}, "blocked": {"x": "y"},
                                "blocked_tokens": {}, "token_history": {}}))  # fmt: skip
    fresh = hub()
    fresh.keep_admission(path, restore=False)
    assert fresh.blocked == {} and json.loads(path.read_text())["blocked"] == {}


@pytest.mark.parametrize(
    "content",
    ["{", "[]", json.dumps({"format": 1, "job": "other"}), json.dumps({"format": 1, "job": JOB})],
)
def test_admission_state_that_is_not_this_jobs_is_refused_by_name(tmp_path: Path, content: str) -> None:
    path = tmp_path / "admission.json"
    path.write_text(content)
    with pytest.raises(VolunteerAdmissionError, match=str(path)):
        hub().keep_admission(path, restore=True)
