"""Pods the scheduler cannot place show its reason in the job's status, and the condition goes once they
are placed."""

from __future__ import annotations

from dverl_operator.status import conditions as cond
from tests.support.cluster_world import World
from tests.support.operator_fixtures import tiny_spec

NO_GPU = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available"


def unplaceable(world: World, name: str, message: str = NO_GPU) -> None:
    world.pods[name]["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ],
    }


def test_an_unschedulable_pod_names_itself_its_role_and_the_schedulers_reason() -> None:
    world = World(tiny_spec())
    world.settle()
    world.run_pods("j-rollout-0", "j-rollout-1")
    unplaceable(world, "j-learner-0")
    world.step()
    world.step()
    found = cond.condition(world.status["conditions"], cond.UNSCHEDULABLE)
    assert found is not None and found["status"] == "True"
    assert found["message"] == f"pod j-learner-0 (learner) cannot be scheduled: {NO_GPU}"
    assert world.status["phase"] == "Pending" and world.status["message"] == found["message"]
    assert [e for e in world.events if e[1] == "Unschedulable"] == [
        ("Warning", "Unschedulable", found["message"])
    ]

    world.run_pods("j-learner-0")
    world.step()
    assert cond.condition(world.status["conditions"], cond.UNSCHEDULABLE) is None
    assert world.status["phase"] == "Running" and world.status["message"] == ""


def test_several_unplaced_pods_are_counted_and_a_changed_reason_announced_again() -> None:
    world = World(tiny_spec())
    world.settle()
    for name in ("j-learner-0", "j-rollout-0", "j-rollout-1"):
        unplaceable(
            world, name, "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector"
        )
    world.step()
    found = cond.condition(world.status["conditions"], cond.UNSCHEDULABLE)
    assert found is not None and found["message"].endswith("(and 2 more)")
    unplaceable(world, "j-learner-0", NO_GPU)
    world.step()
    assert len([e for e in world.events if e[1] == "Unschedulable"]) == 2


def test_a_pod_no_node_takes_is_named_before_its_siblings_held_for_the_gang() -> None:
    world = World(tiny_spec())
    world.settle()
    unplaceable(world, "j-learner-0", "rejected due to timeout after waiting 1m0s at plugin Coscheduling")
    unplaceable(world, "j-rollout-0", NO_GPU)
    unplaceable(world, "j-rollout-1", "rejected due to timeout after waiting 1m0s at plugin Coscheduling")
    world.step()
    found = cond.condition(world.status["conditions"], cond.UNSCHEDULABLE)
    assert found is not None
    assert found["message"] == f"pod j-rollout-0 (rollout) cannot be scheduled: {NO_GPU} (and 2 more)"
