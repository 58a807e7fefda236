"""The learner's final progress handed over as its termination message, and the operator taking it
into `.status` when its last poll came before the last step."""

from __future__ import annotations

from pathlib import Path

import pytest

from decentralized_verl.core.final_report import final_fields, read_final, write_final, write_verdict
from dverl_operator.status.outcome import with_final_report

SUMMARY = {"steps": 3, "policy_version": 3, "reward_last": 0.25, "seconds": 1.0}


def test_written_where_the_kubelet_reads_it_and_read_back(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert write_final(SUMMARY, log) is False  # no file: not in a pod, nothing written
    log.touch()
    assert write_final(SUMMARY, log) is True
    assert read_final(log.read_text()) == {"step": 3, "policyVersion": 3, "reward": 0.25}
    assert final_fields({**SUMMARY, "reward_last": float("nan")}) == {"step": 3, "policyVersion": 3}


@pytest.mark.parametrize(
    "message",
    ["", "Traceback ...\nerror: spec.model.path: missing", '{"dverlFinal": {"step": -1}}',
     '{"dverlFinal": {"step": "3"}}', '{"dverlFinal": [3]}', '{"other": {"step": 3}}', "{not json"],
)  # fmt: skip
def test_anything_else_in_a_termination_message_is_no_final_report(message: str) -> None:
    assert read_final(message) == {}


def _learner(message: str) -> dict:
    ended = {"exitCode": 0, "reason": "Completed", "message": message}
    return {"status": {"containerStatuses": [{"name": "worker", "state": {"terminated": ended}}]}}


def test_the_operator_takes_the_final_step_only_when_it_is_not_behind() -> None:
    message = '{"dverlFinal": {"step": 3, "policyVersion": 3, "reward": 0.5}}\n'
    status = {"step": 2, "reward": 0.1, "workers": "2/2"}
    assert with_final_report(status, _learner(message)) == {
        "step": 3, "policyVersion": 3, "reward": 0.5, "workers": "2/2"}  # fmt: skip
    assert with_final_report({"step": 4}, _learner(message)) == {"step": 4}
    assert with_final_report(status, None) == status
    assert with_final_report(status, _learner("bye")) == status


def test_a_refit_verdict_is_the_whole_termination_message_and_no_final_report(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    verdict = (
        "refit parity failed after the refresh to policy version 3:\n rollout r-0 and learner l-0 differ"
    )
    assert write_verdict(verdict, log) is False  # not in a pod
    log.touch()
    assert write_verdict(verdict, log) is True
    assert log.read_text() == " ".join(verdict.split()) + "\n"
    assert read_final(log.read_text()) == {}
