"""A container waiting on an image the kubelet cannot pull shows in the job's status with the kubelet's
words, announced once while its reason alternates, and the condition goes once the image is there."""

from __future__ import annotations

from dverl_operator.status import conditions as cond
from dverl_operator.status.image_pulls import cannot_pull
from tests.support.cluster_world import World
from tests.support.operator_fixtures import tiny_spec

IMAGE = "ghcr.io/dverl/dverl-worker:0.1.0-vllm-cpu"
NOT_FOUND = f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": not found'


def pulling(world: World, name: str, reason: str, message: str, init: bool = False) -> None:
    key = "initContainerStatuses" if init else "containerStatuses"
    world.pods[name]["status"] = {
        "phase": "Pending",
        key: [
            {"name": "worker", "image": IMAGE, "state": {"waiting": {"reason": reason, "message": message}}}
        ],
    }


def test_a_pod_waiting_on_its_image_names_pod_role_container_image_and_the_kubelets_words() -> None:
    world = World(tiny_spec())
    world.settle()
    world.run_pods("j-rollout-0", "j-rollout-1")
    pulling(world, "j-learner-0", "ErrImagePull", NOT_FOUND)
    world.step()
    found = cond.condition(world.status["conditions"], cond.IMAGE_PULL_FAILED)
    assert found is not None and found["status"] == "True" and found["reason"] == "ErrImagePull"
    image = world.pods["j-learner-0"]["spec"]["containers"][0]["image"]
    assert (
        found["message"]
        == f'pod j-learner-0 (learner): container worker cannot pull image "{image}": {NOT_FOUND}'
    )
    assert world.status["phase"] == "Pending" and world.status["message"] == found["message"]

    pulling(world, "j-learner-0", "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')
    world.step()
    found = cond.condition(world.status["conditions"], cond.IMAGE_PULL_FAILED)
    assert found["reason"] == "ImagePullBackOff" and "Back-off pulling image" in found["message"]
    assert len([e for e in world.events if e[1] == cond.IMAGE_PULL_FAILED]) == 1  # once, not per retry
    assert world.status.get("phase") != "Failed"  # the kubelet keeps trying; so does the job

    world.run_pods("j-learner-0")
    world.step()
    assert cond.condition(world.status["conditions"], cond.IMAGE_PULL_FAILED) is None
    assert world.status["phase"] == "Running"


def test_only_pull_waits_of_live_pods_count_init_containers_included() -> None:
    def pod(reason: str, deleting: bool = False, key: str = "containerStatuses") -> dict:
        meta = {"labels": {"dverl.io/role": "rollout"}, **({"deletionTimestamp": "x"} if deleting else {})}
        state = {"waiting": {"reason": reason, "message": "m"}}
        return {
            "metadata": meta,
            "spec": {
                "initContainers": [{"name": "fetch", "image": "busybox"}],
                "containers": [{"name": "worker", "image": IMAGE}],
            },
            "status": {key: [{"name": "fetch" if key.startswith("init") else "worker", "state": state}]},
        }

    found = cannot_pull(
        {
            "a": pod("ImagePullBackOff"),
            "b": pod("CrashLoopBackOff"),
            "c": pod("ErrImagePull", deleting=True),
            "d": pod("InvalidImageName", key="initContainerStatuses"),
        }
    )
    assert [reason for reason, _ in found] == ["ImagePullBackOff", "InvalidImageName"]
    assert found[1][1] == 'pod d (rollout): container fetch cannot pull image "busybox": m'
