"""Failures by kind, as Kubernetes' pod failure policies tell them apart: a bad-input exit and a kill
for memory end the job at once, with what the worker said or the role's limit and the planner's fix;
anything else retries up to backoffLimit. Preemption and eviction keep one vocabulary; the step shown
never goes backwards."""

from __future__ import annotations

from typing import Any

from decentralized_verl.core.memory_report import MemoryEstimate, estimate_line
from decentralized_verl.core.status import JobStatus
from decentralized_verl.errors import EXIT_REFIT_PARITY, EXIT_USAGE, REFIT_PARITY_REASON
from dverl_operator.pods.failure import ending, failure_reason
from dverl_operator.status import conditions as cond
from dverl_operator.status import outcome
from tests.support.cluster_world import World
from tests.support.operator_fixtures import tiny_spec

MISSING_MODEL = "error: spec.model.path: '/models/missing' is not a directory"


def ended(world: World, name: str, code: int, reason: str = "Error", message: str = "") -> None:
    terminated = {"exitCode": code, "reason": reason, "message": message}
    world.pods[name]["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"name": "worker", "state": {"terminated": terminated}}],
    }


def started(spec: dict[str, Any]) -> World:
    world = World(spec)
    world.settle()
    world.run_pods()
    world.step()
    return world


def failed_condition(world: World) -> dict[str, Any]:
    found = cond.condition(world.status["conditions"], cond.FAILED)
    assert found is not None, world.status
    return found


def test_a_bad_input_exit_fails_the_job_at_once_with_the_workers_message() -> None:
    world = started({**tiny_spec(), "backoffLimit": 6})
    ended(world, "j-learner-0", EXIT_USAGE, message=MISSING_MODEL)
    world.step()
    assert world.status["phase"] == "Failed"
    failed = failed_condition(world)
    assert failed["reason"] == "BadInput"
    assert failed["message"] == (
        f"pod j-learner-0 (learner): container worker exited 2 (bad input, not retried): {MISSING_MODEL}"
    )
    assert ("Warning", "BadInput", failed["message"]) in world.events
    assert world.pods == {} or all(p["metadata"].get("deletionTimestamp") for p in world.pods.values()), (
        "every pod of a failed job goes"
    )


def test_a_long_log_tail_is_quoted_from_its_end_where_the_cause_is() -> None:
    """FallbackToLogsOnError hands over the log's tail: start-up chatter first, the cause last."""
    world = started({**tiny_spec(), "backoffLimit": 6})
    chatter = "\n".join(f"2026-11-28 12:00:{i:02d} INFO worker: starting part {i}" for i in range(20))
    ended(world, "j-learner-0", EXIT_USAGE, message=f"{chatter}\nerror: {MISSING_MODEL}\n")
    world.step()
    message = failed_condition(world)["message"]
    assert message.endswith(f"error: {MISSING_MODEL}"), message
    assert "(bad input, not retried): …" in message, message


def test_an_ordinary_crash_is_retried_with_backoff_not_failed() -> None:
    world = started({**tiny_spec(), "backoffLimit": 6})
    ended(world, "j-rollout-0", 1, message="Traceback ... RuntimeError: boom")
    world.step()
    assert world.status["phase"] != "Failed"
    assert world.status["roles"]["rollout"]["restarts"] == 1
    restarting = cond.condition(world.status["conditions"], cond.RESTARTING)
    assert restarting is not None and "backoff" in restarting["message"]


def test_an_oom_kill_names_the_role_its_limit_and_the_planners_fix() -> None:
    spec = tiny_spec()
    spec["roles"]["rollout"]["resources"] = {"memory": "600Mi"}
    world = started({**spec, "backoffLimit": 6})
    ended(world, "j-rollout-1", 137, reason="OOMKilled")
    world.step()
    assert world.status["phase"] == "Failed"
    failed = failed_condition(world)
    assert failed["reason"] == "OOMKilled"
    message = failed["message"]
    assert message.startswith(
        "pod j-rollout-1 (rollout): container worker was OOMKilled under its memory limit 600Mi"
    )
    assert "planner estimates ~0.5 GiB" in message
    assert "set roles.rollout.resources.memory >= 900Mi or lower roles.rollout.microbatchSize" in message


def test_an_oom_kill_without_a_limit_says_the_node_ran_out() -> None:
    world = started({**tiny_spec(), "backoffLimit": 6})
    ended(world, "j-learner-0", 137, reason="OOMKilled")
    world.step()
    assert "no memory limit (the node ran out)" in failed_condition(world)["message"]


def folder_model_spec() -> dict[str, Any]:
    """A model the operator cannot size: a folder it never reads."""
    spec = tiny_spec(model={"path": "models/m"})
    spec["roles"]["learner"]["resources"] = {"memory": "2Gi"}
    return {**spec, "backoffLimit": 6}


LEARNER_SAID = estimate_line(MemoryEstimate("learner", 35_429_146_656, None))
"""What a learner of a 1B-parameter model left as its termination message before the kernel killed it."""


def test_an_oom_kill_names_the_estimate_the_worker_left_when_the_operator_has_none() -> None:
    world = started(folder_model_spec())
    ended(world, "j-learner-0", 137, reason="OOMKilled", message=LEARNER_SAID)
    world.step()
    failed = failed_condition(world)
    assert failed["reason"] == "OOMKilled"
    assert failed["message"] == (
        "pod j-learner-0 (learner): container worker was OOMKilled under its memory limit 2Gi; the planner "
        "estimates ~33.0 GiB of host memory per learner worker; set roles.learner.resources.memory >= "
        "42Gi or lower roles.learner.microbatchSize"
    )
    failed_events = [m for kind, reason, m in world.events if reason == "WorkerFailed"]
    assert failed_events and all("dverlMemory" not in m for m in failed_events), world.events
    assert all("dverlMemory" not in m for _, _, m in world.events)


def test_the_workers_estimate_comes_before_the_operators_own() -> None:
    spec = tiny_spec()
    spec["roles"]["rollout"]["resources"] = {"memory": "600Mi"}
    world = started({**spec, "backoffLimit": 6})
    said = estimate_line(MemoryEstimate("rollout", 3 * 1024**3, None))
    ended(world, "j-rollout-1", 137, reason="OOMKilled", message=said)
    world.step()
    message = failed_condition(world)["message"]
    assert "the planner estimates ~3.0 GiB of host memory per rollout worker" in message
    assert "set roles.rollout.resources.memory >= 3840Mi or lower roles.rollout.microbatchSize" in message


def test_a_limit_far_over_the_estimate_is_raised_by_half_all_the_same() -> None:
    spec = folder_model_spec()
    spec["roles"]["learner"]["resources"] = {"memory": "64Gi"}
    world = started(spec)
    ended(world, "j-learner-0", 137, reason="OOMKilled", message=LEARNER_SAID)
    world.step()
    assert (
        "~33.0 GiB of host memory per learner worker; set roles.learner.resources.memory >= 96Gi"
        in (failed_condition(world)["message"])
    )


def test_without_a_well_formed_estimate_of_its_own_role_the_fix_is_the_fallback() -> None:
    for said in (
        "",
        "Killed",
        estimate_line(MemoryEstimate("rollout", 35_429_146_656, None)),  # another role's figures
        '{"dverlMemory": {"role": "learner", "hostBytes": "35429146656"}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1' + "0" * 30 + "}}",
    ):
        world = started(folder_model_spec())
        ended(world, "j-learner-0", 137, reason="OOMKilled", message=said)
        world.step()
        message = failed_condition(world)["message"]
        assert "the planner has no estimate for learner (its model's shape is unknown to it): raise " in (
            message
        ), (said, message)
        assert "roles.learner.resources.memory to >= 3072Mi or lower" in message, message


def test_an_estimate_left_by_a_worker_that_died_another_way_is_never_its_message() -> None:
    world = started(folder_model_spec())
    ended(world, "j-learner-0", 137, reason="Error", message=LEARNER_SAID)  # killed, not for memory
    world.step()
    assert world.status["phase"] != "Failed"
    assert world.status["roles"]["learner"]["restarts"] == 1
    pod = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "worker",
                    "state": {"terminated": {"exitCode": 137, "reason": "Error", "message": LEARNER_SAID}},
                }
            ],
        }
    }
    assert failure_reason(pod) == "container worker exited 137: Error"
    got = ending(pod)
    assert (got.kind, got.message, got.estimate) == ("other", "", None)  # only a kill for memory reads it


def test_a_bad_input_init_container_is_read_before_the_worker() -> None:
    pod = {
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "fetch-data", "state": {"terminated": {"exitCode": 2, "message": "bad URI"}}}
            ],
            "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}],
        }
    }
    got = ending(pod)
    assert (got.kind, got.container, got.message) == ("bad-input", "fetch-data", "bad URI")
    assert ending({"status": {"phase": "Failed", "reason": "Evicted"}}).kind == "other"


def test_a_bad_input_exit_wins_over_the_backoff_limit_it_also_crosses() -> None:
    world = started({**tiny_spec(), "backoffLimit": 0})
    ended(world, "j-rollout-0", 1)
    ended(world, "j-learner-0", EXIT_USAGE, message=MISSING_MODEL)
    world.step()
    assert failed_condition(world)["reason"] == "BadInput"


def test_an_eviction_is_called_evicted_in_the_condition_and_the_event_alike() -> None:
    world = started(tiny_spec())
    world.pods["j-rollout-1"]["status"] = {"phase": "Failed", "reason": "Evicted", "message": "node pressure"}
    world.step()
    restarting = cond.condition(world.status["conditions"], cond.RESTARTING)
    assert restarting is not None and restarting["reason"] == "Evicted"
    assert [e[1] for e in world.events if e[0] == "Warning"] == ["Evicted"]
    assert "was evicted" in restarting["message"]


def test_a_preemption_is_called_preempted_in_the_condition_and_the_event_alike() -> None:
    world = started(tiny_spec())
    world.preempt("j-rollout-1")
    world.step()
    restarting = cond.condition(world.status["conditions"], cond.RESTARTING)
    assert restarting is not None and restarting["reason"] == "Preempted"
    assert [e[1] for e in world.events if e[0] == "Warning"] == ["Preempted"]


def progress(step: int) -> JobStatus:
    return JobStatus(state="Running", step=step, total_steps=20)


def test_the_step_never_goes_backwards_while_a_restarted_learner_catches_up() -> None:
    status: dict[str, Any] = {}
    shown = []
    clock = []
    for now, step in enumerate([7, 8, 0, 5, 6, 8, 9], start=1):
        status, _ = outcome.progress_status(status, dict(status), progress(step), None, 20, float(now))
        shown.append(status["step"])
        clock.append(status["lastProgressTime"])
    assert shown == [7, 8, 8, 8, 8, 8, 9]
    assert status["reportedStep"] == 9
    # The stall watchdog's clock moves with every change of the reported step, catching up included.
    assert len(set(clock)) == 7


def test_the_stall_clock_stays_put_while_the_reported_step_stands_still() -> None:
    status, _ = outcome.progress_status({}, {}, progress(3), None, 20, 1.0)
    again, _ = outcome.progress_status(status, dict(status), progress(3), None, 20, 50.0)
    assert again["lastProgressTime"] == status["lastProgressTime"]


REFIT_VERDICT = (
    "refit parity failed after the refresh to policy version 3: rollout j-rollout-1 (max 7.1) and learner "
    "j-learner-0 disagree on the same tokens by 2.4 nats per token on average (max 7.1), over "
    "training.refitParityBound 0.5; the weights the rollout loaded are not the learner's"
)


def test_a_refit_parity_exit_fails_the_job_at_once_naming_both_workers_and_the_version() -> None:
    world = started({**tiny_spec(), "backoffLimit": 6})
    ended(world, "j-learner-0", EXIT_REFIT_PARITY, message=REFIT_VERDICT)
    world.step()
    assert world.status["phase"] == "Failed"
    failed = failed_condition(world)
    assert failed["reason"] == "RefitParityFailed"
    assert failed["message"] == (
        f"pod j-learner-0 (learner): container worker exited 3 (refit parity failed, not retried): "
        f"{REFIT_VERDICT}"
    )
    assert ("Warning", "RefitParityFailed", failed["message"]) in world.events
    assert world.status["roles"]["learner"]["restarts"] == 1


def test_a_long_refit_verdict_is_kept_whole_where_other_messages_are_cut() -> None:
    many = ", ".join(f"j-rollout-{i} (max 7.1)" for i in range(4))
    verdict = (
        f"refit parity failed after the refresh to policy version 9: rollout {many} and learner j-learner-0"
    )
    pod = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "worker",
                    "state": {"terminated": {"exitCode": EXIT_REFIT_PARITY, "message": verdict}},
                }
            ],
        }
    }
    got = ending(pod)
    assert (got.kind, got.exit_code, got.message) == ("refit-parity", 3, verdict)


def test_exit_3_from_a_worker_that_is_not_the_learner_is_retried_like_any_crash() -> None:
    world = started({**tiny_spec(), "backoffLimit": 6})
    ended(world, "j-rollout-0", EXIT_REFIT_PARITY, message="something else")
    world.step()
    assert world.status["phase"] != "Failed"
    assert world.status["roles"]["rollout"]["restarts"] == 1


def test_a_coordinator_that_reports_a_refit_failure_fails_the_job_for_that_reason_in_its_words() -> None:
    progress = JobStatus(
        state="Failed", step=2, total_steps=3, failure=REFIT_VERDICT, failure_reason=REFIT_PARITY_REASON
    )
    status, events = outcome.coordinator_failed({}, [], 1.0, progress)
    failed = cond.condition(status["conditions"], cond.FAILED)
    assert failed is not None and failed["reason"] == REFIT_PARITY_REASON
    assert failed["message"] == f"the coordinator reports the training failed: {REFIT_VERDICT}"
    assert events == [("Warning", REFIT_PARITY_REASON, failed["message"])]
    plain, _ = outcome.coordinator_failed({}, [], 1.0, JobStatus(state="Failed"))
    assert cond.condition(plain["conditions"], cond.FAILED)["reason"] == "CoordinatorFailed"
    assert plain["message"] == "the coordinator reports the training failed"
