"""A job run the way `dverl run`'s learner runs it, every role in this process (`replicas: 0`): the
coordinator, trainer, colocated rollout, reward and reference that `build_loop` puts together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from decentralized_verl.orchestration.assemble import build_loop
from decentralized_verl.orchestration.wiring import connect_roles
from decentralized_verl.training.trainer import PolicyTrainer


async def run_in_process(
    spec: Any, model: Any, tokenizer: Any, output: Path, *, job: str = "job", status: Any = None
) -> dict:
    """Train `model` (built from `spec.model`) for the spec's steps; returns the run's summary, its
    metrics in `output/metrics.jsonl`, and what the Status RPC would send on `status` (a StatusBoard)."""
    roles = await connect_roles(
        spec, job, model, tokenizer, temperature=1.0, publisher=None,
        addresses=lambda role: [], pools=lambda role: [],
    )  # fmt: skip
    loop = await build_loop(
        spec, PolicyTrainer(model, spec), tokenizer, roles, job=job, output=output, status=status
    )
    try:
        return await loop.run()
    finally:
        await loop.close()
