"""The command protocol of a training role whose ranks act as one: rank 0 decides, ranks > 0 follow.

A sharded model's every forward, backward, gather and checkpoint is a collective, so every rank must run
it at the same moment on its own part. Rank 0 is the only rank anything outside talks to (the learner's
loop, the critic's gRPC calls); before it starts a collective it scatters one `Command` per rank, and the
followers, blocked in `follow`, run the action the command names. One command at a time, in order, so
every rank meets every collective in the same sequence.

`split_rounds` is how such a group divides a batch's micro-batches: every rank runs the same number of
rounds, so none waits in a collective another rank never joins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from decentralized_verl.runtime import device

log = logging.getLogger(__name__)

T = TypeVar("T")
STOP = "stop"

Action = Callable[[Any, Any], Any]
"""What a follower runs for a command: (the rank's target, the command's payload) -> ignored."""


@dataclass(frozen=True)
class Command:
    name: str
    payload: Any = None


def receive() -> Command:
    """Ranks > 0: wait for rank 0's next command."""
    box: list[Any] = [None]
    dist.scatter_object_list(box, None, src=0)
    return box[0]


def announce(commands: Sequence[Command]) -> Any:
    """Rank 0: send command r to rank r; returns rank 0's own payload."""
    box: list[Any] = [None]
    dist.scatter_object_list(box, list(commands), src=0)
    return box[0].payload


def follow(target: Any, actions: Mapping[str, Action]) -> None:
    """Ranks > 0: run rank 0's commands on `target` until told to stop."""
    while (command := receive()).name != STOP:
        try:
            action = actions[command.name]
        except KeyError:
            raise ValueError(f"command: {command.name!r} is not one of {sorted(actions)}") from None
        action(target, command.payload)


def split_rounds(items: Sequence[T], rank: int, world: int) -> list[tuple[int, T]]:
    """This rank's share of `items` as (index, item) per round: item i goes to rank i % world, and every
    rank runs ceil(len / world) rounds. A rank with no item left in the last round gets item 0 again under
    index -1: it must still run the collective forward/backward, but its result counts for nothing."""
    rounds = -(-len(items) // world) if items else 0
    out: list[tuple[int, T]] = []
    for r in range(rounds):
        index = r * world + rank
        out.append((index, items[index]) if index < len(items) else (-1, items[0]))
    return out


def world_of(sharded: bool) -> tuple[int, int]:
    """(rank, world) of the process group a sharded model spans; (0, 1) for a model that is not."""
    if sharded and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device() -> torch.device:
    """Where the process group's collectives run: the GPU under nccl (it cannot reduce CPU tensors),
    else the CPU."""
    return device.collective_device()
