"""Learner ranks' process group: rendezvous, a weights digest to check replicas kept step, and the exit.

Rendezvous comes from the environment torchrun would set (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
What the ranks do together is `training.learner_group`'s.

A learner process of a distributed group ends with `exit_process`, never through interpreter teardown:
destroying a gloo process group joins its worker threads while holding the GIL, and a worker thread that
is still releasing a Python-owned tensor waits for the GIL, so the process hangs at exit (seen as a
learner that wrote its summary and never exited). The group is left to the operating system.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys

import torch
import torch.distributed as dist

from decentralized_verl.core.memory_report import clear_estimate
from decentralized_verl.runtime import device
from decentralized_verl.runtime.ports import free_port


def init_distributed(world: int, rank: int, *, sharded: bool = False) -> None:
    """Join the learner ranks' group, with the backend of the process's device (`runtime.device`); a
    sharded learner needs one even alone (FSDP2 shards over a device mesh), which without a rendezvous
    address gets a private one on loopback."""
    if dist.is_initialized() or (world == 1 and not sharded):
        return
    init_method = "env://"
    if world == 1 and "MASTER_ADDR" not in os.environ:
        init_method = f"tcp://127.0.0.1:{free_port()}"
    device.init_process_group(world, rank, init_method=init_method)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: replicas that stayed in lock-step have equal digests."""
    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def exit_process(code: int) -> None:
    """End a learner of a distributed group now: flush what it wrote, then leave without running
    destructors (see the module docstring). Leaving this way skips every `finally`, so the memory
    estimate the worker left as its termination message is cleared here (a kill for memory it is not)."""
    clear_estimate()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
