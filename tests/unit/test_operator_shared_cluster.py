"""Shared clusters, the operator's pure core: gang PodGroups (coscheduling, Volcano), Kueue pod groups and
admission, priority classes, preemption that spends no backoffLimit, and the Queued phase.

The in-memory world of cluster_world.py applies each pass's actions the way the API server would, so every
test runs the real `decide` pass after pass, as the operator does.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import parse_spec
from dverl_operator.children import gang, kueue
from dverl_operator.flags import gang_schedulers
from dverl_operator.objects import quantity
from dverl_operator.pods.decisions import ANNOTATION_FAILURE_COUNTED
from dverl_operator.pods.disruption import disruption, event_reason
from dverl_operator.reconcile.settings import Settings
from dverl_operator.status import conditions as cond
from tests.support.cluster_world import BOTH, World
from tests.support.operator_fixtures import tiny_spec

QUEUE = {kueue.QUEUE_LABEL: "team-a"}


def gang_spec(scheduler: str = "coscheduling", **gang_fields: Any) -> dict[str, Any]:
    spec = tiny_spec()
    spec["scheduling"] = {"gang": {"scheduler": scheduler, **gang_fields}}
    spec["roles"]["learner"]["resources"] = {"cpu": "2", "memory": "8Gi", "gpus": 1}
    spec["roles"]["rollout"]["resources"] = {"cpu": "500m", "memory": "4Gi", "gpus": 1}
    return spec


# ------------------------------------------------------------------------------------------- the spec
@pytest.mark.parametrize(
    ("scheduling", "field_path"),
    [
        ({"gang": {"scheduler": "coscheduling", "queue": "q"}}, "spec.scheduling.gang.queue"),
        (
            {"gang": {"scheduler": "volcano", "scheduleTimeoutSeconds": 5}},
            "spec.scheduling.gang.scheduleTimeoutSeconds",
        ),
        ({"gang": {"scheduler": "coscheduling", "minRollout": 3}}, "spec.scheduling.gang.minRollout"),
        ({"gang": {"scheduler": "yunikorn"}}, "spec.scheduling.gang.scheduler"),
        ({"gang": {}}, "spec.scheduling.gang.scheduler"),
        ({"gang": {"scheduler": "volcano", "minRollout": -1}}, "spec.scheduling.gang.minRollout"),
        ({"gangs": {}}, "spec.scheduling.gangs"),
    ],
)
def test_bad_scheduling_is_refused_naming_the_field(scheduling: dict[str, Any], field_path: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_spec({**tiny_spec(), "scheduling": scheduling})
    assert any(p.path == field_path for p in caught.value.problems), caught.value.problems


@pytest.mark.parametrize("name", ["High", "a_b", "-x", ""])
def test_a_bad_priority_class_name_is_refused(name: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_spec({**tiny_spec(), "priorityClassName": name})
    assert any(p.path == "spec.priorityClassName" for p in caught.value.problems)


def test_quantities_add_up_as_kubectl_writes_them() -> None:
    assert quantity.render_cpu(quantity.total(["500m", "2", "1.5"])) == "4"
    assert quantity.render_cpu(quantity.total(["500m", "250m"])) == "750m"
    assert quantity.render_bytes(quantity.total(["16Gi", "512Mi"])) == "16896Mi"
    assert quantity.render_bytes(quantity.total(["1G"])) == "1000000000"
    assert quantity.parse("2Ki") == Decimal(2048)
    with pytest.raises(ValueError, match="'2 cores'"):
        quantity.parse("2 cores")


def test_the_operator_flag_names_an_unknown_gang_scheduler() -> None:
    assert gang_schedulers("volcano, coscheduling") == BOTH
    assert gang_schedulers("") == frozenset()
    with pytest.raises(SystemExit, match="unknown yunikorn"):
        gang_schedulers("volcano,yunikorn")


# ------------------------------------------------------------------------------------------- gangs
def test_a_coscheduling_gang_counts_every_planned_pod_and_adds_up_their_requests() -> None:
    world = World(gang_spec(scheduleTimeoutSeconds=120))
    world.step()
    group = world.pod_groups["coscheduling"]
    assert group is not None and group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert group["spec"] == {
        "minMember": 3,  # 1 learner + 2 rollout replicas
        "minResources": {"cpu": "3", "memory": "16Gi", "nvidia.com/gpu": "3"},
        "scheduleTimeoutSeconds": 120,
    }
    for pod in world.pods.values():
        assert pod["metadata"]["labels"][gang.COSCHEDULING_LABEL] == "j"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_a_volcano_gang_carries_its_queue_and_the_priority_and_pods_carry_the_group_annotation() -> None:
    spec = {**gang_spec("volcano", queue="research", minRollout=1), "priorityClassName": "rl-high"}
    world = World(spec)
    world.step()
    group = world.pod_groups["volcano"]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 2,  # the learner and one rollout replica must start together
        "minResources": {"cpu": "2500m", "memory": "12Gi", "nvidia.com/gpu": "2"},
        "queue": "research",
        "priorityClassName": "rl-high",
    }
    for pod in world.pods.values():
        assert pod["metadata"]["annotations"][gang.VOLCANO_ANNOTATION] == "j"
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["spec"]["priorityClassName"] == "rl-high"


def test_the_spec_scheduler_name_wins_over_the_gang_default() -> None:
    world = World({**gang_spec("volcano"), "schedulerName": "volcano-gpu"})
    world.step()
    assert {p["spec"]["schedulerName"] for p in world.pods.values()} == {"volcano-gpu"}


def test_volunteers_never_count_but_every_cluster_worker_does() -> None:
    spec = gang_spec()
    spec["volunteers"] = {"enabled": True, "tokenSecretRef": {"name": "s"}}
    spec["roles"]["reference"] = {"replicas": 1}
    world = World(spec)
    world.step()
    assert world.pod_groups["coscheduling"]["spec"]["minMember"] == len(world.pods) == 5


def test_the_gang_follows_scale_goes_on_suspend_and_comes_back_on_resume() -> None:
    world = World(gang_spec())
    world.settle()
    assert world.pod_groups["coscheduling"]["spec"]["minMember"] == 3
    world.spec["roles"]["rollout"]["replicas"] = 4
    actions = world.settle()
    assert world.pod_groups["coscheduling"]["spec"]["minMember"] == 5 and len(world.pods) == 5
    assert not any(kind.startswith("PodGroup") for kind, _ in actions.delete)
    world.spec["suspend"] = True
    world.settle()
    assert world.pod_groups["coscheduling"] is None and world.pods == {}
    assert world.status["phase"] == "Suspended"
    world.spec["suspend"] = False
    world.settle()
    assert world.pod_groups["coscheduling"]["spec"]["minMember"] == 5


def test_a_gang_edited_by_hand_is_restored_and_a_scheduler_change_moves_it() -> None:
    world = World(gang_spec())
    world.settle()
    world.pod_groups["coscheduling"]["spec"]["minMember"] = 1
    world.pod_groups["coscheduling"]["status"] = {"phase": "Pending"}
    world.step()
    assert world.pod_groups["coscheduling"]["spec"]["minMember"] == 3
    world.spec["scheduling"]["gang"] = {"scheduler": "volcano"}
    world.settle()
    assert world.pod_groups["coscheduling"] is None and world.pod_groups["volcano"]["spec"]["minMember"] == 3
    assert all(gang.COSCHEDULING_LABEL not in p["metadata"]["labels"] for p in world.pods.values())


def test_a_gang_scheduler_the_chart_did_not_enable_is_refused_by_field() -> None:
    world = World(gang_spec("volcano"), settings=Settings(gang_schedulers=frozenset({"coscheduling"})))
    actions = world.step()
    assert world.status["phase"] == "Failed" and world.pods == {} and not actions.create
    assert world.status["message"].startswith(
        "spec.scheduling.gang.scheduler: volcano PodGroups are not enabled"
    )
    assert "gangScheduling.volcano=true" in world.status["message"]


def test_a_gang_holds_the_job_queued_until_enough_of_it_is_placed() -> None:
    world = World(gang_spec(minRollout=1))
    world.settle()
    assert world.status["phase"] == "Queued"
    queued = cond.condition(world.status["conditions"], cond.QUEUED)
    assert queued["reason"] == "WaitingForGang" and "0/2 of the gang placed" in queued["message"]
    assert [e for e in world.events if e[1] == "Queued"] == [("Normal", "Queued", queued["message"])]
    world.run_pods("j-learner-0", "j-rollout-0")  # minMember placed: no longer held by the gang
    world.step()
    assert (
        world.status["phase"] == "Pending" and cond.condition(world.status["conditions"], cond.QUEUED) is None
    )
    world.run_pods()
    world.step()
    assert world.status["phase"] == "Running"


def test_finished_jobs_drop_their_gang() -> None:
    world = World(gang_spec())
    world.settle()
    world.run_pods()
    world.pods["j-learner-0"]["status"] = {"phase": "Succeeded"}
    world.settle()
    assert world.status["phase"] == "Succeeded" and world.pod_groups["coscheduling"] is None


# -------------------------------------------------------------------------------------------- Kueue
def test_kueue_pods_carry_the_queue_and_one_group_with_its_total_count() -> None:
    world = World(tiny_spec(), labels=QUEUE)
    world.settle()
    groups = {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in world.pods.values()}
    assert len(groups) == 1
    (group,) = groups
    assert group.startswith("j-") and world.status["kueuePodGroup"] == {
        "name": group,
        "totalCount": 3,
        "finished": False,
    }
    for pod in world.pods.values():
        assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
        assert pod["metadata"]["annotations"][kueue.TOTAL_ANNOTATION] == "3"


def test_pods_held_by_kueues_gate_make_the_job_queued_then_running_once_admitted() -> None:
    world = World(tiny_spec(), labels=QUEUE)
    world.step()
    world.gate_pods()
    world.settle()
    assert world.status["phase"] == "Queued"
    queued = cond.condition(world.status["conditions"], cond.QUEUED)
    assert queued["reason"] == "WaitingForAdmission" and "kueue.x-k8s.io/admission" in queued["message"]
    assert cond.condition(world.status["conditions"], cond.FAILED) is None
    assert sum(1 for e in world.events if e[1] == "Queued") == 1
    world.run_pods()  # admitted: Kueue lifts the gates, the pods start
    world.step()
    assert (
        world.status["phase"] == "Running" and cond.condition(world.status["conditions"], cond.QUEUED) is None
    )


def test_suspend_finishes_the_kueue_group_and_resume_queues_a_new_one() -> None:
    world = World(tiny_spec(), labels=QUEUE)
    world.settle()
    world.run_pods()
    first = world.status["kueuePodGroup"]["name"]
    world.spec["suspend"] = True
    actions = world.step()
    finished = {name for kind, name, patch in actions.patch if kind == "Pod" and _retriable_false(patch)}
    assert finished == {"j-learner-0", "j-rollout-0", "j-rollout-1"}  # marked before they go
    assert world.status["kueuePodGroup"]["finished"] is True and world.pods == {}
    world.spec["suspend"] = False
    world.settle()
    second = world.status["kueuePodGroup"]["name"]
    assert second != first and {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in world.pods.values()} == {
        second
    }
    again = World(tiny_spec(), labels=QUEUE, status=copy.deepcopy(world.status))
    assert kueue.current_group(again.status, "j", "u-1", 3).name == second  # the same name every pass


def test_scaling_a_kueue_job_moves_it_to_a_new_group_and_finishes_the_old_one() -> None:
    world = World(tiny_spec(), labels=QUEUE)
    world.settle()
    world.run_pods()
    old = world.status["kueuePodGroup"]["name"]
    world.spec["roles"]["rollout"]["replicas"] = 3
    actions = world.step()
    assert {name for kind, name, patch in actions.patch if _retriable_false(patch)} == {
        "j-learner-0",
        "j-rollout-0",
        "j-rollout-1",
    }
    world.settle()
    new = world.status["kueuePodGroup"]
    assert new["name"] != old and new["totalCount"] == 4
    assert {p["metadata"]["annotations"][kueue.TOTAL_ANNOTATION] for p in world.pods.values()} == {"4"}
    assert {p["metadata"]["labels"][kueue.GROUP_LABEL] for p in world.pods.values()} == {new["name"]}


def test_a_failed_kueue_job_releases_its_quota() -> None:
    spec = {**tiny_spec(), "backoffLimit": 0}
    world = World(spec, labels=QUEUE)
    world.settle()
    world.run_pods()
    world.pods["j-rollout-0"]["status"] = {"phase": "Failed"}
    actions = world.step()
    assert world.status["phase"] == "Failed"
    assert {name for _, name, patch in actions.patch if _retriable_false(patch)} == set(world.pods) | {
        name for kind, name in actions.delete if kind == "Pod"
    }
    assert world.status["kueuePodGroup"]["finished"] is True


def test_a_kueue_job_that_succeeds_finishes_every_group_patching_each_pod_once() -> None:
    world = World(tiny_spec(), labels=QUEUE)
    world.settle()
    world.run_pods()
    world.spec["roles"]["rollout"]["replicas"] = 3  # a new group is due: the old pods are outside it ...
    world.pods["j-learner-0"]["status"] = {"phase": "Succeeded"}  # ... and the job ends in the same pass
    actions = world.step()
    assert world.status["phase"] == "Succeeded" and world.status["kueuePodGroup"]["finished"] is True
    patched = [name for kind, name, patch in actions.patch if kind == "Pod" and _retriable_false(patch)]
    assert sorted(patched) == ["j-learner-0", "j-rollout-0", "j-rollout-1"]


def test_kueue_preemption_deletes_the_pods_and_the_job_queues_again_in_the_same_group() -> None:
    world = World({**tiny_spec(), "backoffLimit": 0}, labels=QUEUE)
    world.settle()
    world.run_pods()
    world.step()
    group = world.status["kueuePodGroup"]["name"]
    world.pods.clear()  # Kueue preempted the workload: it deleted every pod of the group
    world.step()
    world.gate_pods()
    world.settle()
    assert world.status["phase"] == "Queued" and world.status["kueuePodGroup"]["name"] == group
    assert world.status["roles"]["learner"]["restarts"] == 0


def _retriable_false(patch: dict[str, Any]) -> bool:
    return (patch.get("metadata") or {}).get("annotations", {}).get(kueue.RETRIABLE_ANNOTATION) == "false"


# --------------------------------------------------------------------------------------- preemption
def test_disruption_is_read_from_the_condition_or_the_pods_reason() -> None:
    cond = {
        "status": {
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        }
    }
    assert disruption(cond) == "EvictionByEvictionAPI"
    assert (
        disruption({"status": {"phase": "Failed", "reason": "Evicted", "message": "memory"}})
        == "Evicted: memory"
    )
    assert disruption({"status": {"phase": "Failed", "reason": "Error"}}) is None
    off = {"status": {"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "False"}]}}
    assert disruption(off) is None


@pytest.mark.parametrize(
    ("why", "reason"),
    [
        ("TerminationByKubelet: The node was low on resource: memory.", "Evicted"),
        ("EvictionByEvictionAPI: Eviction API: evicting", "Evicted"),
        ("DeletionByTaintManager: Taint manager: deleting due to NoExecute taint", "Evicted"),
        ("Evicted: memory", "Evicted"),
        ("PreemptionByScheduler: Kube-scheduler: preempting", "Preempted"),
        ("Preempted: Preempted to accommodate a workload", "Preempted"),
    ],
)
def test_an_event_names_an_eviction_by_the_kubelet_an_eviction(why: str, reason: str) -> None:
    assert event_reason(why) == reason


def test_a_preempted_learner_restarts_the_gang_without_spending_backoff_limit() -> None:
    world = World(
        {
            **tiny_spec(),
            "backoffLimit": 0,
            "roles": {"rollout": {"replicas": 2}, "learner": {"replicas": 2}},
        }
    )
    world.settle()
    world.run_pods()
    world.step()
    for round_ in range(3):  # more preemptions than backoffLimit allows failures
        world.preempt("j-learner-1")
        actions = world.step()
        deleted = {name for kind, name in actions.delete if kind == "Pod"}
        assert deleted == {"j-learner-0", "j-learner-1"}, round_  # the whole gang, at once (no backoff)
        assert "j-rollout-0" not in deleted
        world.settle()
        assert {"j-learner-0", "j-learner-1"} <= set(world.pods)
        world.run_pods()
        world.step()
    assert world.status["phase"] == "Running"
    assert world.status["roles"]["learner"]["restarts"] == 0
    preempted = [e for e in world.events if e[1] == "Preempted"]
    assert len(preempted) == 3 and "PreemptionByScheduler: higher priority" in preempted[0][2]
    assert "without counting against backoffLimit" in preempted[0][2]


def test_an_evicted_rollout_worker_is_replaced_at_once_even_under_fail_job() -> None:
    spec = tiny_spec()
    spec["roles"]["rollout"]["failurePolicy"] = "failJob"
    world = World(spec)
    world.settle()
    world.run_pods()
    world.pods["j-rollout-1"]["status"] = {"phase": "Failed", "reason": "Evicted", "message": "node pressure"}
    actions = world.step()
    assert ("Pod", "j-rollout-1") in actions.delete and world.status["phase"] != "Failed"
    assert [e[1] for e in world.events if e[0] == "Warning"] == ["Evicted"]
    world.settle()
    assert "j-rollout-1" in world.pods and world.status["roles"]["rollout"]["restarts"] == 0


def test_a_pod_taken_away_while_terminating_is_announced_once() -> None:
    world = World(tiny_spec())
    world.settle()
    world.run_pods()
    world.pods["j-rollout-0"]["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    world.preempt("j-rollout-0", reason="PreemptionByScheduler")
    world.step()
    world.step()
    assert world.pods["j-rollout-0"]["metadata"]["annotations"][ANNOTATION_FAILURE_COUNTED] == "disrupted"
    assert sum(1 for e in world.events if e[1] == "Preempted") == 1


def test_an_ordinary_failure_still_counts() -> None:
    world = World({**tiny_spec(), "backoffLimit": 0})
    world.settle()
    world.run_pods()
    world.pods["j-rollout-0"]["status"] = {"phase": "Failed", "reason": "Error"}
    world.step()
    assert world.status["phase"] == "Failed"


# ------------------------------------------------------------------------------- a sharded critic's gang
def sharded_critic_world() -> World:
    spec = tiny_spec(algorithm={"name": "ppo"})
    spec["roles"]["critic"] = {"replicas": 2, "sharding": "fsdp"}
    world = World(spec)
    world.settle()
    world.run_pods()
    world.step()
    return world


def test_a_missing_critic_rank_takes_its_whole_gang_down_and_back_together() -> None:
    world = sharded_critic_world()
    del world.pods["j-critic-1"]
    actions = world.step()
    assert ("Pod", "j-critic-0") in actions.delete and not any(
        o["metadata"]["name"].startswith("j-critic") for o in actions.create
    )  # every old rank gone before the gang is made again
    assert not any(name.startswith(("j-learner", "j-rollout")) for kind, name in actions.delete)
    world.settle()
    assert {"j-critic-0", "j-critic-1"} <= set(world.pods)


def test_a_preempted_critic_rank_restarts_the_critic_gang_without_spending_backoff() -> None:
    world = sharded_critic_world()
    world.spec["backoffLimit"] = 0
    world.preempt("j-critic-0")
    actions = world.step()
    assert {name for kind, name in actions.delete} == {"j-critic-0", "j-critic-1"}
    world.settle()
    assert world.status["phase"] != "Failed" and world.status["roles"]["critic"]["restarts"] == 0
