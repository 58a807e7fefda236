"""One rank of a sharded critic for `test_critic_sharding` (2 CPU ranks, gloo, under torchrun):
`torchrun --standalone --nproc_per_node 2 tests/support/critic_sharding_worker.py OUT`.

Rank 0 drives a `ShardedCritic` (as the gRPC servicer would), rank 1 follows its commands. Each variant
takes STEPS updates on `requests(step)`, persisting a DCP checkpoint after each, then a fresh critic gang
resumes from those checkpoints and takes one more update. Rank 0 writes what it saw to OUT/<variant>.json
and the gathered weights to OUT/<variant>-*.pt. The helpers are imported by the test for the unsharded
reference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.spec.manifest import parse_job

STEPS = 3
INIT_SEED = 11
TINY = {"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64, "seed": 3}


def spec_with(**critic):
    """A PPO job whose critic cuts 5 samples into micro-batches of 2: 3 micro-batches, so rank 0 runs
    two and rank 1 one and a zero-weight filler; the learning rate is high enough for weights to move."""
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "t"},
        "spec": {
            "model": {"tiny": TINY},
            "algorithm": {"name": "ppo", "samplesPerPrompt": 1},
            "data": {"train": "x.jsonl"},
            "roles": {
                "rollout": {"replicas": 1, "batchSize": 4},
                "critic": {"replicas": 2, "microbatchSize": 2, **critic},
            },
            "training": {"batchSize": 4, "criticLearningRate": 0.01, "warmupSteps": 0},
        },
    }
    return parse_job(doc).spec


def critic_worker(spec):
    """The spec's critic, its value head drawn from the same seed on every rank and in the reference."""
    from decentralized_verl.serving.scoring import CriticWorker

    torch.manual_seed(INIT_SEED)
    return CriticWorker.from_spec(spec)


def requests(step: int) -> tuple[list[Sample], list[tuple[float, ...]], list[tuple[float, ...]]]:
    """5 samples of different prompt and response lengths, with returns and old values to fit."""
    g = torch.Generator().manual_seed(1000 + step)
    samples, returns, old = [], [], []
    for i in range(5):
        prompt = tuple(torch.randint(5, 90, (2 + i % 3,), generator=g).tolist())
        response = tuple(torch.randint(5, 90, (1 + i,), generator=g).tolist())
        samples.append(Sample(Prompt(f"p{i}", i, prompt, ""), 0, response, (), "stop", "", 0))
        returns.append(tuple((torch.rand(len(response), generator=g) * 2 - 1).tolist()))
        old.append(tuple((torch.rand(len(response), generator=g) * 0.2).tolist()))
    return samples, returns, old


def probe() -> list[Sample]:
    return requests(99)[0]


def _gathered(model) -> dict[str, torch.Tensor]:
    from decentralized_verl.training.sharding import full_state_dict

    return dict(full_state_dict(model))


def _variant(name: str, spec, out: Path, rank: int) -> None:
    from decentralized_verl.serving.sharded_critic import ACTIONS, ShardedCritic
    from decentralized_verl.training import rank_group

    folder = out / name
    worker = critic_worker(spec)
    assert worker.world == 2
    local = sum(p.to_local().numel() for p in worker.model.parameters())
    if rank != 0:
        rank_group.follow(worker, ACTIONS)
        _gathered(worker.model)
        resumed = critic_worker(spec)
        rank_group.follow(resumed, ACTIONS)
        _gathered(resumed.model)
        return
    critic = ShardedCritic(worker, folder)
    result: dict = {"local_numel": local, "total_numel": sum(p.numel() for p in worker.model.parameters())}
    result["values_before"] = critic.values(probe())
    result["losses"] = [critic.train(*requests(step), policy_version=step) for step in range(STEPS)]
    result["values_after"] = critic.values(probe())
    result["version"] = critic.version
    critic.close()
    torch.save(_gathered(worker.model), out / f"{name}-trained.pt")

    resumed = ShardedCritic(critic_worker(spec), folder)
    result["resumed_version"] = resumed.version
    result["resumed_values"] = resumed.values(probe())
    result["resumed_loss"] = resumed.train(*requests(STEPS), policy_version=STEPS)
    result["checkpoints"] = sorted(p.name for p in (folder / "checkpoints").iterdir())
    resumed.close()
    torch.save(_gathered(resumed.worker.model), out / f"{name}-resumed.pt")
    (out / f"{name}.json").write_text(json.dumps(result))


def main(out: Path) -> None:
    from decentralized_verl.training import distributed

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    distributed.init_distributed(world, rank, sharded=True)
    _variant("fsdp", spec_with(sharding="fsdp"), out, rank)
    _variant(
        "fsdp_checkpointed_offload",
        spec_with(sharding="fsdp", activationCheckpointing=True, cpuOffload=True),
        out,
        rank,
    )
    torch.distributed.barrier()
    distributed.exit_process(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
