"""A critic that survives its own restart: its state (weights, optimizer, updates taken) is written after
every update, from a background thread, atomically (write, then rename), and read back when it starts.

A critic is the one role whose worker learns, so a restarted one would otherwise start from scratch.
After a learner restart the critic keeps its newest state: it may be a few updates ahead of the resumed
policy, and its value function re-fits from there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.core.samples import Sample
from decentralized_verl.training.checkpoints.space import room_for, tensor_bytes

log = logging.getLogger(__name__)

STATE_FILE = "critic-state.pt"


class PersistentCritic:
    """The `CriticWorker` interface (values, train, version, worker_id), persisting after each update."""

    def __init__(self, worker: Any, folder: Path) -> None:
        self.worker = worker
        self.worker_id = worker.worker_id
        self.path = folder / STATE_FILE
        folder.mkdir(parents=True, exist_ok=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="critic-state")
        self._pending: concurrent.futures.Future[None] | None = None
        if self.path.exists():
            worker.load_state(torch.load(self.path, map_location="cpu", weights_only=True))
            log.info(
                "%s: restored its state after %d updates from %s", self.worker_id, worker.version, self.path
            )

    @property
    def version(self) -> int:
        return self.worker.version

    def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return self.worker.values(samples)

    def train(self, samples, returns, old_values, policy_version: int = 0) -> float:
        loss = self.worker.train(samples, returns, old_values, policy_version)
        state = self.worker.state()
        if self._pending is not None:
            self._pending.result()
        self._pending = self._pool.submit(self._write, state)
        return loss

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with room_for(self.path, tensor_bytes(state)):
                torch.save(state, tmp)
                tmp.replace(self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.result()
        self._pool.shutdown(wait=True)
