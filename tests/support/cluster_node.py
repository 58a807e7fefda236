"""The operator and the test node together: what the cluster tests share (the example in cluster form,
the operator run with the cluster's DNS, the data claim)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.job_manifests import TOY
from tests.support.node_harness import Node
from tests.support.operator_fixtures import Emulator, Operator
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


def shipped(name: str, steps: int = 2) -> dict[str, Any]:
    """A shipped example's spec as shipped (its paths, image and sources), cut short: `steps` steps of a
    few samples, no evaluation, no checkpoints."""
    spec = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())["spec"]
    spec["algorithm"] = {**spec["algorithm"], "samplesPerPrompt": 2}
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
    tmp: Path, claims: dict[str, Path], *extra: str, chart_values: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Emulator, Node, Operator]]:
    """The emulator, the node and the real operator (dialing coordinators by their Service names);
    `chart_values` are the chart's `--set`s the operator's rights are rendered with."""
    async with Emulator(tmp, chart_values) as emu, Node(emu, tmp, claims=claims) as node:
        op = Operator(emu, "op-a", *extra)
        op.args = node.operator_command(op.args)
        op.start()
        try:
            yield emu, node, op
        finally:
            await asyncio.to_thread(op.stop)  # the emulator keeps serving while it shuts down
