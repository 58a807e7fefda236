"""Data-parallel learner replicas in lock-step: rendezvous, shards from rank 0, and a final check that
every replica holds the same weights.

Rank 0 runs the loop and scatters each update's shard; ranks > 0 only follow (`follow`). Rendezvous comes
from the environment torchrun would set (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

A learner process of a distributed group ends with `exit_process`, never through interpreter teardown:
destroying a gloo process group joins its worker threads while holding the GIL, and a worker thread that
is still releasing a Python-owned tensor waits for the GIL, so the process hangs at exit (seen as a
learner that wrote its summary and never exited). The group is left to the operating system.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist


def init_distributed(world: int, rank: int) -> None:
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)


def scatter(shards: list[Any]) -> Any:
    """Rank 0: send each rank its shard, return rank 0's own."""
    box: list[Any] = [None]
    dist.scatter_object_list(box, shards, src=0)
    return box[0]


def follow(trainer: Any) -> int:
    """Ranks > 0: receive a shard, update (DDP averages gradients with rank 0), until told to stop."""
    while True:
        box: list[Any] = [None]
        dist.scatter_object_list(box, None, src=0)
        if box[0] is None:
            break
        trainer.update(box[0])
    gather_digests(trainer.model)
    return 0


def release_followers(model: torch.nn.Module, world: int) -> list[str]:
    """Rank 0: tell every follower to stop; returns each replica's weights digest (equal when in step)."""
    scatter([None] * world)
    return gather_digests(model)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: replicas that stayed in lock-step have equal digests."""
    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def gather_digests(model: torch.nn.Module) -> list[str]:
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(model))
    return digests


def exit_process(code: int) -> None:
    """End a learner of a distributed group now: flush what it wrote, then leave without running
    destructors (see the module docstring)."""
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
