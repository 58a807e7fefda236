"""The shipped examples that fit a CPU, applied as shipped (their relative data paths, images and sources
included) to the emulated cluster and run on the test node, one harness for all: each is cut to two small
steps and must reach Succeeded, its data found in the worker image's examples folder (which the node binds
as the image's layers would). verifiers-guessing runs in the `-verifiers` worker image (the node has it:
the stand-in's venv carries verifiers); ppo-critic-reward-model scores with the reward model that
examples/stages.yaml's reward stage leaves on the `rl-stages` claim (a tiny one put there, as that stage
would). The vLLM-CPU examples name the `-vllm-cpu` image, which this test's node is not given: their pods
wait on the pull and the job says which image, as it would on a cluster whose registry lacks it. Where the
vLLM venv is installed (scripts/install-vllm.sh), they run in that image to Succeeded in
tests/e2e/test_cluster_vllm_examples.py.

The GPU-sized examples are applied in tests/e2e/test_cluster_no_room.py (they wait Unschedulable on a node
without GPUs) and, where the vLLM venv is installed, run to Running on nodes that play their GPU node pools
in tests/e2e/test_cluster_gpu_examples.py; the SmolLM2 ones in tests/e2e/test_cluster_smollm2_examples.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dverl_operator.status import conditions as cond
from tests.support.cluster_node import claims, cluster, run_to_the_end, shipped
from tests.support.local_models import save_tiny_reward_model
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for

REASON = refused()
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
CPU_SIZED = (
    "tiny-grpo",
    "tiny-cispo",
    "tiny-gspo",
    "tiny-vanilla-pg",
    "tiny-rollout-correction",
    "tiny-multiturn",
    "tiny-grpo-fsdp",
    "verifiers-guessing",
    "ppo-critic-reward-model",
)
"""Every shipped example with a config-built model (two FSDP learner ranks in tiny-grpo-fsdp; a critic,
two rollouts and a reward-model worker in ppo-critic-reward-model)."""
VLLM_CPU = ("smollm2-arithmetic-grpo-vllm", "smollm2-calculator-tools-vllm")
STEPS = 2


async def test_every_cpu_sized_example_succeeds_as_shipped(tmp_path: Path) -> None:
    """All at once on the one node (each is tiny; together they finish sooner than one after another)."""
    volumes = claims(tmp_path)
    volumes["rl-stages"] = tmp_path / "claims" / "rl-stages"
    for written in save_tiny_reward_model(volumes["rl-stages"] / "reward").iterdir():
        written.chmod(0o644)  # safetensors saves 0600; the stage's pod wrote it as the workers' user
    async with cluster(tmp_path, volumes) as (emu, node, op):
        for name in VLLM_CPU:
            await emu.create_job(name.replace("smollm2-", "s-"), shipped(name, STEPS))
        specs = {name: shipped(name, STEPS) for name in CPU_SIZED}
        for name, spec in specs.items():
            assert not spec["data"]["train"].startswith("/"), f"{name}: a relative path, found in the image"
        statuses = await run_to_the_end(emu, node, op, specs, timeout=800)
        said = {name: (status.get("phase"), status.get("message")) for name, status in statuses.items()}
        for name, status in statuses.items():
            assert status["phase"] == "Succeeded", f"{name}: {said}\n{node.all_logs()[-4000:]}"
            assert status["step"] == STEPS, (name, status)
            # It was Running: every worker Ready at once (each learner rank of tiny-grpo-fsdp included).
            assert status.get("startTime"), (name, status)

        async def waiting_on_the_image() -> dict[str, dict] | None:
            found = {
                name: ((await emu.job(name.replace("smollm2-", "s-"))) or {}).get("status") or {}
                for name in VLLM_CPU
            }
            pulls = {
                name: cond.condition(s.get("conditions") or [], cond.IMAGE_PULL_FAILED)
                for name, s in found.items()
            }
            return found if all(pulls.values()) else None

        vllm = await wait_for(waiting_on_the_image, timeout=60, interval=0.5, what="the vLLM image refused")
        events = [(e["reason"], e["message"]) for e in await emu.events()]
    for name, status in vllm.items():
        assert status.get("phase") == "Pending", (name, status)
        pull = cond.condition(status["conditions"], cond.IMAGE_PULL_FAILED)
        assert pull["reason"] in ("ErrImagePull", "ImagePullBackOff"), pull
        assert 'cannot pull image "ghcr.io/dverl/dverl-worker:0.1.0-vllm-cpu"' in pull["message"], pull
        assert f"pod {name.replace('smollm2-', 's-')}-learner-0 (learner): container " in pull["message"], (
            pull
        )
        assert status["message"] == pull["message"], status
    pulled = [m for r, m in events if r == cond.IMAGE_PULL_FAILED]
    assert len(pulled) == len(VLLM_CPU), events  # one event a job, not one a retry
