"""Deterministic, resumable prompt order: the same seed gives the same batches on every machine,
and `(epoch, offset)` is all a checkpoint needs to continue exactly where a learner stopped.

Each epoch is a fresh shuffle seeded from `(seed, epoch)` alone (not from the previous epoch's
state), so jumping to any epoch costs one shuffle. `offset` counts items of the epoch already
handed out, which keeps a saved state meaningful even if a restart changes the batch size.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

from decentralized_verl.errors import DataError


def epoch_order(n_items: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The permutation of `range(n_items)` used in `epoch` (independent of Python's hash seed)."""
    order = list(range(n_items))
    if shuffle:
        digest = hashlib.sha256(f"dverl-sampler:{seed}:{epoch}".encode()).digest()
        random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


class PromptSampler:
    """Batches of item indices, epoch after epoch, forever; a caller stops after its steps.

    `batch_size` is the global batch. With `world_size > 1` every rank walks the same global
    sequence and keeps its contiguous slice of each batch (`batch_size / world_size` items), so
    the ranks' slices of one step are disjoint and together are the global batch. A short last
    batch (`drop_last=False`) is padded for sharding with items from the start of the epoch's
    order until it divides evenly, so no rank gets an empty or larger slice.
    """

    def __init__(
        self,
        n_items: int,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ) -> None:
        if n_items < 1:
            raise ValueError(f"n_items: must be >= 1 (got {n_items})")
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1 (got {batch_size})")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in 0..{world_size - 1} (got {rank}; world_size {world_size})")
        if batch_size % world_size:
            raise ValueError(f"batch_size: must be divisible by world_size {world_size} (got {batch_size})")
        if drop_last and n_items < batch_size:
            raise ValueError(f"batch_size: {batch_size} > {n_items} items leaves no batch with drop_last")
        self.n_items, self.batch_size, self.seed = n_items, batch_size, seed
        self.drop_last, self.rank, self.world_size, self.shuffle = drop_last, rank, world_size, shuffle
        self.epoch, self.offset = 0, 0
        self._cached: tuple[int, list[int]] | None = None

    # ------------------------------------------------------------------------------------ order
    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.n_items, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _order(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_order(self.n_items, self.seed, epoch, self.shuffle))
        return self._cached[1]

    def _normalise(self) -> None:
        """Move past an exhausted epoch (or a tail too short to use with drop_last)."""
        remaining = self.n_items - self.offset
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch, self.offset = self.epoch + 1, 0

    def _take(self) -> tuple[list[int], list[int]]:
        self._normalise()
        order = self._order(self.epoch)
        batch = order[self.offset : self.offset + self.batch_size]
        self.offset += len(batch)
        self._normalise()
        return order, batch

    def next_global_batch(self) -> list[int]:
        """The whole next batch (what the coordinator sends to rollout), advancing the state."""
        return self._take()[1]

    def next_batch(self) -> list[int]:
        """This rank's slice of the next global batch, advancing the state."""
        order, batch = self._take()
        return self.shard(batch, order)

    def shard(self, batch: list[int], order: list[int] | None = None) -> list[int]:
        """This rank's contiguous slice of a global batch (padded from `order` to divide evenly)."""
        if self.world_size == 1:
            return list(batch)
        padded = list(batch)
        filler = order if order else batch
        i = 0
        while len(padded) % self.world_size:
            padded.append(filler[i % len(filler)])
            i += 1
        per = len(padded) // self.world_size
        return padded[self.rank * per : (self.rank + 1) * per]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    # ------------------------------------------------------------------------------------ state
    def state(self) -> dict[str, int]:
        """Where the next batch starts; store it in the checkpoint."""
        self._normalise()
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved `state()`; a state that cannot belong to this data raises DataError."""
        values: dict[str, int] = {}
        for key in ("epoch", "offset"):
            value = state.get(key) if isinstance(state, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DataError(f"sampler state: {key}: expected an integer >= 0 (got {value!r})")
            values[key] = value
        if values["offset"] > self.n_items:
            raise DataError(
                f"sampler state: offset: {values['offset']} is past the end of the data "
                f"({self.n_items} items); was the checkpoint made with another data file?"
            )
        self.epoch, self.offset = values["epoch"], values["offset"]
        self._normalise()
