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
from job_manifests import TOY
from node_harness import Node
from operator_fixtures import Emulator, Operator

REPO = Path(__file__).resolve().parents[1]


def cluster_spec(example: str = "tiny-grpo", steps: int = 3) -> dict[str, Any]:
    """A shipped example as a cluster runs it: a few small steps, its data from the `rl-data` claim
    at /data."""
    spec = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())["spec"]
    spec["data"] = {k: v for k, v in spec["data"].items() if k != "eval"} | {"train": "/data/train.jsonl"}
    spec["sources"] = [
        {"name": "toy-data", "mountPath": "/data", "pvc": {"claimName": "rl-data", "subPath": "toy"}}
    ]
    spec["algorithm"] = {**spec["algorithm"], "samplesPerPrompt": 2}
    spec["roles"]["rollout"] = {**spec["roles"]["rollout"], "batchSize": 4}
    spec["training"] = {
        **spec["training"],
        "steps": steps,
        "batchSize": 4,
        "minibatchSize": 4,
        "evalEvery": 0,
    }
    return spec


def data_claim(tmp: Path) -> Path:
    """The `rl-data` claim's folder, holding the toy task in `toy/`."""
    folder = tmp / "claims" / "rl-data"
    (folder / "toy").mkdir(parents=True)
    for name in ("train.jsonl", "eval.jsonl"):
        shutil.copy(TOY / name, folder / "toy" / name)
    return folder


@contextlib.asynccontextmanager
async def cluster(
    tmp: Path, claims: dict[str, Path], *extra: str
) -> AsyncIterator[tuple[Emulator, Node, Operator]]:
    """The emulator, the node and the real operator (dialing coordinators by their Service names)."""
    async with Emulator(tmp) as emu, Node(emu, tmp, claims=claims) as node:
        op = Operator(emu, "op-a", *extra)
        op.args = node.operator_command(op.args)
        op.start()
        try:
            yield emu, node, op
        finally:
            await asyncio.to_thread(op.stop)  # the emulator keeps serving while it shuts down
