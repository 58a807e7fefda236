"""One rank of the sharded-checkpoint tests, started by torchrun: a tiny Llama sharded with FSDP2 (each
decoder layer, then the root, on a CPU mesh over every rank), AdamW and a warm-up scheduler, trained on fixed
batches.

Under torchrun `main` joins the group torchrun describes; `in_this_process` runs the same tasks as a group of
one inside the caller (the tests' 1-learner runs, sparing a process start). Tasks run in order, each on a
fresh model:
  train:CKPT:DUMP   train SAVE_STEP steps, save a sharded checkpoint to CKPT, take one more step
  resume:CKPT:DUMP  load CKPT into a model built from another seed, take one more step
Rank 0 writes DUMP (torch.save): the full parameters and optimizer state at the checkpoint, the parameters
one step later, the loop state and the logits of a fixed input; the test compares dumps across runs.
"""

from __future__ import annotations

import copy
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spec import ModelSpec, TinyModelSpec
from decentralized_verl.training.checkpoints.sharded import load_sharded, save_sharded

TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=64)
SPEC = ModelSpec(tiny=TINY)
SAVE_STEP = 2
ROWS, LENGTH = 4, 12
"""Each step's batch: 4 rows, split evenly over 1 or 2 ranks so every rank's mean loss weighs the same."""


def batch(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(4, 60, (ROWS, LENGTH), generator=generator)


def probe() -> torch.Tensor:
    return torch.randint(4, 60, (2, LENGTH), generator=torch.Generator().manual_seed(7))


def build(seed: int, world: int):
    model, _ = load_model_and_tokenizer(ModelSpec(tiny=TINY.model_copy(update={"seed": seed})))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, step: int) -> None:
    rows = batch(step)[dist.get_rank() :: dist.get_world_size()]
    model(input_ids=rows, labels=rows).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def full_state(model, optimizer) -> dict:
    """Whole tensors keyed by parameter name, gathered to rank 0 (what the sharded state adds up to), copied:
    with one rank they would otherwise be the live parameters, changed by the next step."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=dist.is_initialized())
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    return copy.deepcopy({"model": model_state, "optimizer": optimizer_state})


def run_task(kind: str, checkpoint: Path, dump: Path, world: int) -> None:
    record: dict = {"world": world}
    if kind == "train":
        model, optimizer, scheduler = build(seed=0, world=world)
        for step in range(1, SAVE_STEP + 1):
            train_step(model, optimizer, scheduler, step)
        state = {"step": SAVE_STEP, "policy_version": SAVE_STEP, "sampler": {"epoch": 0, "offset": 8}}
        save_sharded(model, optimizer, scheduler, checkpoint, state)
    else:
        model, optimizer, scheduler = build(seed=99, world=world)  # other weights: only the load can fix them
        state = load_sharded(model, optimizer, scheduler, checkpoint)
    record["state"] = state
    record["at_checkpoint"] = full_state(model, optimizer)
    record["scheduler"] = scheduler.state_dict()
    with torch.no_grad():
        record["logits"] = model(input_ids=probe()).logits
    train_step(model, optimizer, scheduler, SAVE_STEP + 1)
    record["after"] = full_state(model, optimizer)["model"]
    if dist.get_rank() == 0:
        torch.save(record, dump)


def run_tasks(tasks: list[str]) -> None:
    for task in tasks:
        kind, checkpoint, dump = task.split(":")
        run_task(kind, Path(checkpoint), Path(dump), dist.get_world_size())
        dist.barrier()


def in_this_process(tasks: list[str]) -> None:
    """The tasks as a process group of one in this process, which leaves no group behind."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run_tasks(tasks)
    finally:
        dist.destroy_process_group()


def main(tasks: list[str]) -> None:
    """A torchrun rank: leaves the way the product's learners do (`distributed.exit_process`), since
    tearing a gloo group down at interpreter exit can hang or abort after the work is done."""
    from decentralized_verl.training.distributed import exit_process

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        run_tasks(tasks)
    except BaseException:
        traceback.print_exc()
        exit_process(1)
    exit_process(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1:])
