"""Rank 0's handle on the learner ranks: everything that needs every rank is announced to the followers first,
so they run the same collective at the same time (the protocol is `training.rank_group`'s).

Rank 0 runs the loop; ranks > 0 only follow (`follow`), obeying one command at a time:
- `update`: train on this rank's shard of the batch (DDP or FSDP reduces gradients across ranks);
- `weights`: gather the sharded parameters tensor by tensor (rank 0 streams them into the weight bundle);
- `save` / `restore`: write or read this rank's part of a sharded checkpoint;
- `stop`: leave the loop and compare weights digests.

With DDP only `update` needs the followers: rank 0 holds the whole model, so it publishes weights and
writes checkpoints alone. With FSDP every rank holds a part of every layer, so publishing, checkpointing
and resuming are collectives and go through the group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from decentralized_verl.core.streamed_weights import StreamedWeights, TensorSlot
from decentralized_verl.training import rank_group
from decentralized_verl.training.checkpoints.learner import restore_latest
from decentralized_verl.training.checkpoints.sharded import save_sharded
from decentralized_verl.training.distributed import weights_digest
from decentralized_verl.training.rank_group import Command
from decentralized_verl.training.sharding import (
    full_cpu,
    gathered_digest,
    is_sharded,
    named_state,
    tied_names,
)
from decentralized_verl.training.trainer import rollout_state_dict


def layout(model: nn.Module) -> tuple[tuple[TensorSlot, ...], dict[str, str]]:
    """Every state-dict tensor's name, full shape and dtype (no gathering: a DTensor knows its global
    shape), and tied names (alias -> the name sent). The same on every rank, so all gather in step."""
    aliases = tied_names(model)
    slots = tuple(
        TensorSlot(name, tuple(tensor.shape), tensor.dtype)
        for name, tensor in named_state(model).items()
        if name not in aliases
    )
    return slots, aliases


def gathered(model: nn.Module, slots: tuple[TensorSlot, ...]) -> Iterator[tuple[str, Tensor]]:
    """Collective: each slot's whole tensor, one at a time, in slot order (every rank must drain it)."""
    state = named_state(model)
    for slot in slots:
        yield slot.name, full_cpu(state[slot.name])


def streamed_weights(model: nn.Module) -> StreamedWeights:
    """The whole model's weights as a stream a publisher encodes while gathering (collective)."""
    slots, aliases = layout(model)
    return StreamedWeights(slots, gathered(model, slots), aliases)


def _update(trainer: Any, shard: Any) -> None:
    trainer.update(shard)


def _weights(trainer: Any, _: Any) -> None:
    slots, _aliases = layout(trainer.model)
    for _item in gathered(trainer.model, slots):
        pass


def _save(trainer: Any, payload: tuple[Path, dict[str, Any]]) -> None:
    folder, state = payload
    save_sharded(trainer.model, trainer.optimizer, trainer.scheduler, folder, state)


def _restore(trainer: Any, root: Path) -> Any:
    return restore_latest(trainer, root)


FOLLOWER_ACTIONS: dict[str, Callable[[Any, Any], Any]] = {
    "update": _update,
    "weights": _weights,
    "save": _save,
    "restore": _restore,
}


def follow(trainer: Any) -> int:
    """Ranks > 0: obey rank 0's commands until told to stop, then compare digests."""
    rank_group.follow(trainer, FOLLOWER_ACTIONS)
    _digests(trainer.model)
    return 0


def _digests(model: nn.Module) -> list[str]:
    if is_sharded(model):  # each rank holds different shards: one digest of the gathered weights
        return [gathered_digest(model)]
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(model))
    return digests


class LearnerGroup:
    """Rank 0's side. With one learner every call runs here alone."""

    def __init__(self, trainer: Any, world: int) -> None:
        self.trainer = trainer
        self.world = world
        self.sharded = is_sharded(trainer.model)
        self.released = False

    def _announce(self, commands: list[Command]) -> Any:
        """Send command r to rank r (rank 0's own is returned); no-op with one learner."""
        if self.world == 1:
            return commands[0].payload
        return rank_group.announce(commands)

    def scatter(self, shards: list[Any]) -> Any:
        """Send each rank its shard of the batch for an update; returns rank 0's."""
        return self._announce([Command("update", shard) for shard in shards])

    def weights(self) -> Any:
        """What the rollout workers are sent: rank 0's state dict, or with sharding a stream gathered
        tensor by tensor by every rank together."""
        if not self.sharded:
            return rollout_state_dict(self.trainer.model)
        self._announce([Command("weights")] * self.world)
        return streamed_weights(self.trainer.model)

    def save(self, folder: Path, state: dict[str, Any]) -> None:
        """Every rank writes its part of a sharded checkpoint (rank 0 also the loop state)."""
        self._announce([Command("save", (folder, state))] * self.world)
        _save(self.trainer, (folder, state))

    def restore(self, root: Path) -> Any:
        """Resume from the newest checkpoint under `root` that checks out (a `ResumePoint`, or None): a
        sharded learner reads it on every rank together, whatever learner count wrote it."""
        if self.sharded:
            self._announce([Command("restore", root)] * self.world)
        return _restore(self.trainer, root)

    def release(self) -> list[str]:
        """Tell every follower to stop; returns the weights digests (equal when the replicas kept step;
        one gathered digest with sharding)."""
        if self.released or self.world == 1:
            return []
        self.released = True
        self._announce([Command(rank_group.STOP)] * self.world)
        return _digests(self.trainer.model)
