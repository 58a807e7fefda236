"""Volunteer learners: `dverl worker --role learner --initial-peers MADDR --model PATH --data FILE`.

A gradient synchroniser on hivemind: every volunteer learner computes gradients of a causal-LM
loss (completion tokens only) on its own shard of the data, averages them with the other learners of
the run (hivemind's all-reduce over P2P, weighted by samples), steps, and ends every step with
parameters byte-identical to the others'.

Why not hivemind.Optimizer as is: it steps on local gradients whenever averaging comes back short or
fails (it only logs "Proceeding with local gradients"), and its progress tracker let one learner step
in a group of 1 before its peer was matchmaking. Here each step is:

1. barrier (first step only): announce a `learner` record under the job's DHT key and wait until
   `peers` learners are visible, so nobody starts matchmaking long before the others exist;
2. all-reduce with exactly `peers` learners (averaging.py): hivemind's `GradientAverager` with
   min = target group size = peers, the group's gathered metadata checked (size, job, step) and the
   result checked by value against the members' gradient fingerprints; retried until the deadline,
   then VolunteerError -- a learner never steps alone when peers were expected;
3. the optimizer step on the averaged gradient;
4. leader-wins reconciliation (param_sync.py): all-reduce leaves peers a few float32 ulps apart
   (`local + (average - local)` is not `average`); followers fetch the chunks that differ from the
   group's leader (smallest peer id), so every learner ends the step with the same bytes.

This trains the policy on supervised pairs; the RL loop's learner (entrypoints/learner.py) uses
torch.distributed inside the cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hivemind.optim.grad_averager import GradientAverager
from safetensors.torch import save_file

from decentralized_verl.data.readers import read_rows
from decentralized_verl.entrypoints.open_volunteer import _model_spec
from decentralized_verl.errors import PeerUnavailable, VolunteerError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.training.optimizer_step import optimizer_step
from decentralized_verl.volunteers.announce import (
    VolunteerRecord,
    hardware_summary,
    read_records,
    store_record,
)
from decentralized_verl.volunteers.averaging import average_with_group
from decentralized_verl.volunteers.dht import start_dht
from decentralized_verl.volunteers.param_sync import ParameterSync
from decentralized_verl.volunteers.session import PeerReach

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnerOptions(PeerReach):
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
    barrier_timeout_s: float = 180.0
    """How long to wait for `peers` learners in the DHT, and for each step's full averaging group."""
    matchmaking_s: float = 5.0
    """hivemind's min_matchmaking_time: how long a leader gathers followers before assembling."""
    averaging_timeout_s: float = 60.0
    """One matchmaking attempt; a short attempt is retried until `barrier_timeout_s` has passed."""
    sync_timeout_s: float = 120.0
    """The post-step parameter reconciliation (leader waits for followers, followers for chunks)."""


def read_pairs(path: str) -> list[tuple[str, str]]:
    """(prompt, completion) per record: {prompt, completion} or {text} (all of it is learned)."""
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
    on = next(model.parameters()).device  # the volunteer's device (`runtime.device`)
    return model(input_ids=input_ids.to(on), attention_mask=mask.to(on), labels=target.to(on)).loss


def parameters_digest(model) -> str:
    """sha256 over every parameter's name and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


async def _announce_and_wait(dht, job: str, me: str, peers: int, timeout: float) -> int:
    record = VolunteerRecord(me, "learner", hardware_summary(), 0.0, 0, time.time() + timeout + 600)
    await store_record(dht, job, record)
    deadline = time.monotonic() + timeout
    while True:
        records, _ = await read_records(dht, job)
        seen = sum(1 for r in records if r.role == "learner")
        if seen >= peers:
            return seen
        if time.monotonic() >= deadline:
            raise PeerUnavailable(f"barrier: {seen} of {peers} learners visible after {timeout:g}s")
        await asyncio.sleep(0.5)


def barrier(dht, job: str, me: str, peers: int, timeout: float) -> int:
    """Announce this learner and block until `peers` learners are visible in the job's DHT key."""
    return asyncio.run(_announce_and_wait(dht, job, me, peers, timeout))


def _start_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """An event loop in a daemon thread: it owns the P2P client whose handlers serve parameter sync."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="learner-p2p", daemon=True)
    thread.start()
    return loop, thread


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, p2p) -> None:
    if p2p is not None:
        try:
            asyncio.run_coroutine_threadsafe(p2p.shutdown(), loop).result(10)
        except Exception:  # best effort: the daemon goes away with the DHT anyway
            log.debug("p2p client shutdown failed", exc_info=True)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def run_learner(options: LearnerOptions) -> dict[str, Any]:
    if options.peers < 1 or options.steps < 1 or options.batch_size < 1:
        raise VolunteerError("--peers, --steps and --batch-size must be >= 1")
    torch.manual_seed(0)
    data = shard_of(read_pairs(options.data), options.shard, options.num_shards)
    model, tokenizer = load_model_and_tokenizer(_model_spec(options.model), padding_side="right")
    model.train()
    params = [p for _, p in sorted(model.named_parameters()) if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=options.learning_rate)
    dht = start_dht(dataclasses.replace(options.peer_options(), signed_job=options.job))
    me = dht.peer_id.to_base58()
    loop, thread = _start_loop()
    p2p = averager = None
    try:
        p2p = asyncio.run_coroutine_threadsafe(dht.replicate_p2p(), loop).result(60)
        sync = ParameterSync(p2p, loop, me, params, timeout_s=options.sync_timeout_s)
        sync.register()
        gc.collect()  # the averager is a forked process: garbage is collected here, not inherited by it
        averager = GradientAverager(
            params,
            dht=dht,
            prefix=f"dverl-{options.job}-learners",
            start=True,
            min_group_size=options.peers,
            target_group_size=options.peers,
            min_matchmaking_time=options.matchmaking_s,
            request_timeout=max(0.5, min(3.0, options.matchmaking_s / 2)),
            allreduce_timeout=options.averaging_timeout_s,
            client_mode=options.client_mode,
            warn=False,
        )
        seen = barrier(dht, options.job, me, options.peers, options.barrier_timeout_s)
        print(f"learner {me}: barrier passed ({seen} learners)", flush=True)
        losses: list[float] = []
        group_sizes: list[int] = []
        synced: list[dict[str, Any]] = []
        for step in range(options.steps):
            sgd.zero_grad(set_to_none=False)
            loss = lm_loss(model, tokenizer, batch_for_step(data, step, options.batch_size))
            loss.backward()
            averager.accumulate_grads_(options.batch_size)
            if options.peers > 1:
                averaged = average_with_group(
                    averager,
                    job=options.job,
                    epoch=step,
                    peers=options.peers,
                    weight=options.batch_size,
                    client_mode=options.client_mode,
                    round_timeout_s=options.averaging_timeout_s,
                    allreduce_timeout_s=options.averaging_timeout_s,
                    deadline_s=options.barrier_timeout_s,
                )
                members, reachable = averaged.members, averaged.reachable
            else:  # a run of one learner: nothing to average, its own gradient is the mean
                averager.load_accumulators_into_averager_()
                members = reachable = (me,)
            with averager.use_averaged_gradients():
                optimizer_step(sgd, params, max_grad_norm=None)  # plain SGD on the group's mean gradient
            averager.reset_accumulated_grads_()
            result = sync.sync(step, members, reachable) if len(members) > 1 else None
            group_sizes.append(len(members))
            if result is not None:
                synced.append({"leader": result.leader, "chunks": result.chunks, "fetched": result.fetched})
            losses.append(float(loss.detach()))
            fetched = (
                f", synced {result.fetched}/{result.chunks} chunks from {result.leader}" if result else ""
            )
            print(
                f"learner {me}: step {step + 1}/{options.steps} loss {losses[-1]:.4f} "
                f"averaged with {len(members)} learners{fetched}",
                flush=True,
            )
        result = {
            "peer_id": me,
            "steps": options.steps,
            "epoch": options.steps,
            "losses": losses,
            "peers_per_step": group_sizes,
            "sync": synced,
            "sha256": parameters_digest(model),
        }
        if options.digest_out:
            out = Path(options.digest_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out) + ".safetensors")
            out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"learner {me}: done, parameters sha256 {result['sha256']}", flush=True)
        return result
    finally:
        if averager is not None:
            averager.shutdown()
        _stop_loop(loop, thread, p2p)
        dht.shutdown()


def main_learner(options: LearnerOptions) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_learner(options)
    return 0
