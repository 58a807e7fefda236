"""Volunteer learners: `dverl worker --role learner --initial-peers MADDR --model PATH --data FILE`.

Seed 000's gradient synchroniser on hivemind: every volunteer learner computes gradients of a causal-LM
loss (completion tokens only) on its own shard of the data, and `hivemind.Optimizer` averages them with
the other learners of the run (all-reduce over P2P, weighted by samples) before each optimizer step, so
peers that start from the same weights end every step with the same weights.

Peers start behind a barrier: each announces a `learner` record under the job's DHT key and waits until
`peers` learners are visible, so nobody steps alone. One step = one local batch per peer: a learner
reports its batch, waits until the swarm has the target batch (peers x batch), then steps together.
State averaging is off (identical gradients keep identical parameters; a peer that falls behind
loads the state from the others, hivemind's own recovery).

This trains the policy on supervised pairs; the RL loop's learner (roles/learner.py) uses
torch.distributed inside the cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.errors import VolunteerError

log = logging.getLogger(__name__)

NO_STATE_AVERAGING = 10**9
"""`average_state_every` so large that parameters are never averaged (gradients are)."""


@dataclass(frozen=True)
class LearnerOptions:
    initial_peers: tuple[str, ...]
    model: str
    data: str
    job: str = "quickstart"
    peers: int = 2
    steps: int = 1
    shard: int = 0
    num_shards: int = 1
    batch_size: int = 4
    learning_rate: float = 0.1
    digest_out: str | None = None
    port: int = 0
    host_maddrs: tuple[str, ...] = ()
    announce_maddrs: tuple[str, ...] = ()
    client_mode: bool = False
    barrier_timeout_s: float = 180.0
    matchmaking_s: float = 5.0
    averaging_timeout_s: float = 60.0


def read_pairs(path: str) -> list[tuple[str, str]]:
    """(prompt, completion) per record: {prompt, completion} or {text} (all of it is learned)."""
    from decentralized_verl.data.readers import read_rows

    pairs = []
    for row in read_rows(path):
        value = row.value
        if "text" in value:
            pairs.append(("", str(value["text"])))
        elif "prompt" in value and "completion" in value:
            pairs.append((str(value["prompt"]), str(value["completion"])))
        else:
            raise VolunteerError(f"{row.where}: expected {{prompt, completion}} or {{text}}")
    return pairs


def shard_of(items: list[Any], shard: int, num_shards: int) -> list[Any]:
    """Every `num_shards`-th item starting at `shard`: disjoint shards that cover the data."""
    if not 0 <= shard < num_shards:
        raise VolunteerError(f"--shard: must be in [0, {num_shards}) (got {shard})")
    mine = items[shard::num_shards]
    if not mine:
        raise VolunteerError(f"shard {shard}/{num_shards} of the data is empty ({len(items)} records)")
    return mine


def batch_for_step(items: list[Any], step: int, batch_size: int) -> list[Any]:
    return [items[(step * batch_size + i) % len(items)] for i in range(batch_size)]


def lm_loss(model, tokenizer, pairs: list[tuple[str, str]]):
    """Mean cross-entropy of the completion tokens given their prompts (prompt tokens are not learned)."""
    import torch

    rows, labels = [], []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return model(input_ids=input_ids, attention_mask=mask, labels=target).loss


def parameters_digest(model) -> str:
    """sha256 over every parameter's name and bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


async def _announce_and_wait(dht, job: str, me: str, peers: int, timeout: float) -> int:
    from decentralized_verl.volunteers.announce import (
        VolunteerRecord,
        hardware_summary,
        read_records,
        store_record,
    )

    record = VolunteerRecord(me, "learner", hardware_summary(), 0.0, 0, time.time() + timeout + 600)
    await store_record(dht, job, record)
    deadline = time.monotonic() + timeout
    while True:
        records, _ = await read_records(dht, job)
        seen = sum(1 for r in records if r.role == "learner")
        if seen >= peers:
            return seen
        if time.monotonic() >= deadline:
            raise VolunteerError(f"barrier: {seen} of {peers} learners visible after {timeout:g}s")
        await asyncio.sleep(0.5)


def barrier(dht, job: str, me: str, peers: int, timeout: float) -> int:
    """Announce this learner and block until `peers` learners are visible in the job's DHT key."""
    return asyncio.run(_announce_and_wait(dht, job, me, peers, timeout))


def run_learner(options: LearnerOptions) -> dict[str, Any]:
    import hivemind
    import torch

    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht
    from decentralized_verl.volunteers.open_worker import _model_spec

    if options.peers < 1 or options.steps < 1 or options.batch_size < 1:
        raise VolunteerError("--peers, --steps and --batch-size must be >= 1")
    torch.manual_seed(0)
    data = shard_of(read_pairs(options.data), options.shard, options.num_shards)
    model, tokenizer = load_model_and_tokenizer(_model_spec(options.model), padding_side="right")
    model.train()
    dht = start_dht(
        PeerOptions(
            initial_peers=options.initial_peers,
            host_maddrs=options.host_maddrs or (f"/ip4/0.0.0.0/tcp/{options.port}",),
            announce_maddrs=options.announce_maddrs,
            client_mode=options.client_mode,
        )
    )
    me = dht.peer_id.to_base58()
    try:
        seen = barrier(dht, options.job, me, options.peers, options.barrier_timeout_s)
        print(f"learner {me}: barrier passed ({seen} learners)", flush=True)
        optimizer = hivemind.Optimizer(
            dht=dht,
            run_id=f"dverl-{options.job}-learners",
            params=model.parameters(),
            optimizer=lambda params: torch.optim.SGD(params, lr=options.learning_rate),
            batch_size_per_step=options.batch_size,
            target_batch_size=options.batch_size * options.peers,
            matchmaking_time=options.matchmaking_s,
            averaging_timeout=options.averaging_timeout_s,
            average_state_every=NO_STATE_AVERAGING,
            client_mode=options.client_mode,
            verbose=False,
        )
        losses = []
        group_sizes = []
        try:
            for step in range(options.steps):
                epoch = optimizer.local_epoch
                loss = lm_loss(model, tokenizer, batch_for_step(data, step, options.batch_size))
                loss.backward()
                # Report this batch, then step only once the swarm holds the whole target batch, so
                # every learner contributes exactly one batch to every averaged step.
                optimizer.tracker.report_local_progress(epoch, options.batch_size)
                deadline = time.monotonic() + options.barrier_timeout_s
                while not optimizer.tracker.ready_to_update_epoch:
                    if time.monotonic() > deadline:
                        raise VolunteerError(f"step {step}: the swarm never reached the target batch")
                    time.sleep(0.1)
                group_sizes.append(optimizer.tracker.global_progress.num_peers)
                optimizer.step()
                optimizer.zero_grad()
                if optimizer.local_epoch != epoch + 1:
                    raise VolunteerError(
                        f"step {step}: the optimizer did not step (epoch {optimizer.local_epoch})"
                    )
                losses.append(float(loss.detach()))
                print(f"learner {me}: step {step + 1}/{options.steps} loss {losses[-1]:.4f}", flush=True)
        finally:
            optimizer.shutdown()
        result = {
            "peer_id": me,
            "steps": options.steps,
            "epoch": optimizer.local_epoch,
            "losses": losses,
            "peers_per_step": group_sizes,
            "sha256": parameters_digest(model),
        }
        if options.digest_out:
            from safetensors.torch import save_file

            out = Path(options.digest_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out) + ".safetensors")
            out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"learner {me}: done, parameters sha256 {result['sha256']}", flush=True)
        return result
    finally:
        dht.shutdown()


def main_learner(options: LearnerOptions) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_learner(options)
    return 0
