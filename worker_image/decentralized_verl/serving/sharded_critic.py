"""A critic sharded over its replicas (`roles.critic.sharding: fsdp`): one value model, split with FSDP2.

The replicas are the ranks of one process group (rendezvous on critic 0, as the learners' is on learner
0). Rank 0 alone serves the Critic service; the learner only ever calls it. Every call is a collective,
so rank 0 announces it first (`training.rank_group`) and every rank runs the same `CriticWorker` method
on the same request: each computes its share of the micro-batches (`CriticWorker.values` / `train`).
Ranks > 0 serve only Health, so a readiness probe sees them up.

With an output folder the critic persists as an unsharded one does, after every update, but as a sharded
checkpoint (`training.sharded_checkpoint`: each rank writes its own shards, DCP): `checkpoint-<updates>`
folders under OUTPUT/<critic 0's name>/checkpoints, the newest two kept. A restarted critic gang resumes
from the newest one that checks out, at whatever rank count wrote it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from decentralized_verl.core.samples import Sample
from decentralized_verl.runtime import device
from decentralized_verl.runtime.lifecycle import CALL_GRACE_S, serve_until_stopped
from decentralized_verl.serving import servicers
from decentralized_verl.serving.scoring import CriticWorker
from decentralized_verl.training import rank_group
from decentralized_verl.training.checkpoints.folders import checkpoint_dir
from decentralized_verl.training.checkpoints.learner import prune
from decentralized_verl.training.checkpoints.sharded import load_sharded, newest_usable, save_sharded
from decentralized_verl.training.distributed import init_distributed
from decentralized_verl.training.rank_group import Command

if TYPE_CHECKING:
    from decentralized_verl.settings import WorkerSettings

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
KEEP = 2
"""Sharded critic checkpoints kept: the newest, and the one before in case the newest is torn."""


def save_critic(worker: Any, root: Path) -> Path:
    """Collective: every rank writes its shards of the critic's weights and optimizer as
    `checkpoint-<updates taken>` under `root`; rank 0 then drops all but the newest KEEP."""
    folder = checkpoint_dir(root, worker.version)
    save_sharded(worker.model, worker.optimizer, None, folder, {"version": worker.version})
    if worker.rank == 0:
        prune(root, KEEP)
    return folder


def restore_critic(worker: Any, root: Path) -> Path | None:
    """Collective: load the newest intact critic checkpoint under `root` into every rank's shards; None
    (and nothing changed) when there is none."""
    folder = newest_usable(root, worker.model)
    if folder is None:
        return None
    state = load_sharded(worker.model, worker.optimizer, None, folder, verify=False)
    worker.version = int(state["version"])
    return folder


def _values(worker: Any, samples: list[Sample]) -> list[tuple[float, ...]]:
    return worker.values(samples)


def _train(worker: Any, request: tuple[list[Sample], list[Any], list[Any], int]) -> float:
    return worker.train(*request)


ACTIONS: dict[str, rank_group.Action] = {
    "values": _values,
    "train": _train,
    "save": save_critic,
    "restore": restore_critic,
}


class ShardedCritic:
    """Rank 0's side: the `CriticWorker` interface (values, train, version, worker_id, close), each call
    announced to the other ranks before rank 0 runs its own part."""

    def __init__(self, worker: Any, folder: Path | None = None) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id
        self.world = worker.world
        self.root = folder / CHECKPOINTS if folder is not None else None
        self._lock = threading.Lock()
        """One command at a time: the ranks must meet the collectives in one order."""
        self._closed = False
        if self.root is not None:
            restored = self._all("restore", self.root)
            if restored is not None:
                log.info("%s: restored after %d updates from %s", self.worker_id, self.version, restored)

    @property
    def version(self) -> int:
        return self.worker.version

    def _all(self, name: str, payload: Any) -> Any:
        if self.world > 1:
            rank_group.announce([Command(name, payload)] * self.world)
        return ACTIONS[name](self.worker, payload)

    def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        with self._lock:
            return self._all("values", list(samples))

    def train(self, samples, returns, old_values, policy_version: int = 0) -> float:
        request = (list(samples), [tuple(r) for r in returns], [tuple(v) for v in old_values], policy_version)
        with self._lock:
            loss = self._all("train", request)
            if self.root is not None:
                self._all("save", self.root)
        return loss

    def close(self) -> None:
        """Release the other ranks (they leave `follow`); safe to call twice, and when they are gone."""
        with self._lock:
            if self._closed or self.world == 1:
                return
            self._closed = True
            try:
                rank_group.announce([Command(rank_group.STOP)] * self.world)
            except Exception as exc:  # at a job's end every rank is stopped at once: some went first
                log.info("%s: the other critic ranks had already stopped (%s)", self.worker_id, exc)


async def serve_sharded_critic(
    spec: Any, worker_id: str, port: int, settings: WorkerSettings, output: Path | None
) -> int:
    """One rank of a sharded critic, until stopped (rank 0) or released by rank 0 (the others)."""
    host = settings.server_host()
    rank = settings.rank
    world = settings.world_size or spec.roles.critic.replicas
    torch.manual_seed(spec.training.seed)
    init_distributed(world, rank, sharded=True)
    worker = CriticWorker.from_spec(spec, device=device.process_device(), worker_id=worker_id)
    if rank != 0:
        health = servicers.HealthServicer(role="critic", worker_id=worker_id, ready=True)
        server = await servicers.serve(port, health, host=host)
        try:
            await asyncio.to_thread(rank_group.follow, worker, ACTIONS)
        finally:
            await server.stop(grace=1.0)
        return 0
    critic = ShardedCritic(worker, output / worker_id if output is not None else None)
    health = servicers.HealthServicer(role="critic", worker_id=worker_id, ready=True)
    server = await servicers.serve(port, servicers.CriticServicer(critic), health, host=host)
    try:
        ready = f"{worker_id} ready on port {port} (critic rank 0 of {world}, fsdp)"
        return await serve_until_stopped(ready, announce=log.info)
    finally:
        await server.stop(grace=CALL_GRACE_S)
        critic.close()
