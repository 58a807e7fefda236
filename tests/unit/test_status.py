"""The one Status type: the coordinator's board, the Status RPC, and both readers (the operator and
`dverl run`), which validate every reply and read a malformed one as "no progress".

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import logging
import threading

from decentralized_verl.core.status import JobStatus, RefitParity, StatusBoard
from decentralized_verl.launch.run import coordinator_status
from decentralized_verl.orchestration.refit_check import measured_parity
from decentralized_verl.orchestration.step_report import StepReporter
from dverl_operator.status.fields import progress_fields


def test_the_board_replaces_the_status_whole_and_keeps_blocked_peers_in_order() -> None:
    board = StatusBoard()
    before = board.current
    board.update(step=3, reward_mean=0.5)
    assert before == JobStatus() and board.current.step == 3 and board.current.reward_mean == 0.5
    board.block("p1", "NaN")
    board.block("p2", "bad log-probs")
    board.block("p1", "again")  # once per peer, first reason kept
    assert board.current.blocked_peers == (("p1", "NaN"), ("p2", "bad log-probs"))


def test_concurrent_updates_lose_nothing() -> None:
    board = StatusBoard()

    def block(prefix: str) -> None:
        for i in range(200):
            board.block(f"{prefix}{i}", "x")

    threads = [threading.Thread(target=block, args=(p,)) for p in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(board.current.blocked_peers) == 800


def test_progress_fields_leave_out_numbers_no_step_has_produced() -> None:
    starting = progress_fields(JobStatus(state="Running", total_steps=10))
    assert "reward" not in starting and "kl" not in starting and starting["totalSteps"] == 10
    done = progress_fields(
        JobStatus(step=2, total_steps=10, reward_mean=0.25, kl=0.5, last_checkpoint="/c/2", eval_accuracy=0.0)
    )
    assert done["reward"] == 0.25 and done["lastCheckpoint"] == "/c/2" and done["evalAccuracy"] == 0.0


def test_progress_fields_carry_the_latest_refit_parity_to_four_significant_digits() -> None:
    assert "refitParity" not in progress_fields(JobStatus(step=2, total_steps=10))
    parity = RefitParity(diff_mean=2.345678e-7, diff_max=3.5e-6, version=4, tokens=96)
    fields = progress_fields(JobStatus(step=5, total_steps=10, policy_version=5, refit_parity=parity))
    assert fields["refitParity"] == {
        "meanAbsDiff": 2.346e-7,
        "maxAbsDiff": 3.5e-6,
        "version": 4,
        "tokens": 96,
    }


def test_a_step_that_compared_nothing_keeps_the_last_parity_on_the_board() -> None:
    board = StatusBoard()
    reporter = StepReporter(board, None, None, None, 10, logging.getLogger("test"))
    record = {"reward_mean": 0.5, "reward_std": 0.1, "response_length_mean": 8.0, "tokens_per_second": 9.0}
    metrics = {"refit_logprob_diff_mean": 0.5, "refit_logprob_diff_max": 2.0, "refit_parity_tokens": 40.0}
    reporter.publish(1, 1, record, {}, measured_parity(metrics, 0))
    measured = RefitParity(diff_mean=0.5, diff_max=2.0, version=0, tokens=40)
    assert board.current.refit_parity == measured
    assert measured_parity({}, 1) is None  # every row stale: nothing compared
    reporter.publish(2, 2, record, {}, measured_parity({}, 1))
    assert board.current.step == 2 and board.current.refit_parity == measured


def test_an_unreachable_coordinator_is_no_progress() -> None:
    assert coordinator_status("127.0.0.1:1") is None
