"""`dverl-train --initial-peers MADDR --prompts-file prompts.json --algorithm ppo --num-epochs N`.

Seed 000's quick start on the runtime: the trainer joins the DHT, finds the open job's actor and critic
workers (open_worker.py) by their announcements alone, builds a JobSpec from the flags and runs the same
`Coordinator` loop as `dverl run`. The trainer is the learner and coordinator: it holds the policy,
serves its weights over P2P to the actors it found (and nobody else), generates through them with
throughput-weighted dispatch and re-dispatch (VolunteerHub in open mode), asks the critic peer for
values and value updates (PPO), and computes rewards itself. A fraction of every actor batch is
re-checked against the trainer's own policy (`--verify-fraction`), as for token-admitted volunteers.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl.errors import VolunteerError
from decentralized_verl.volunteers.open_worker import OPEN_JOB
from decentralized_verl.volunteers.rewards import QUICKSTART_REWARD

log = logging.getLogger(__name__)

GROUP_ALGORITHMS = ("grpo", "dapo", "rloo")


@dataclass(frozen=True)
class QuickstartOptions:
    initial_peers: tuple[str, ...]
    prompts_file: str
    algorithm: str = "ppo"
    num_epochs: int = 1
    model: str | None = None
    """Local model folder; default: the folder the actor worker announced (same machine or shared disk)."""
    job: str = OPEN_JOB
    batch_size: int = 8
    samples_per_prompt: int | None = None
    max_new_tokens: int = 32
    reward_type: str = QUICKSTART_REWARD
    reward_model: str | None = None
    learning_rate: float = 1e-5
    verify_fraction: float = 0.05
    seed: int = 0
    wait_workers_s: float = 120.0
    output: str | None = None
    port: int = 0
    host_maddrs: tuple[str, ...] = ()
    announce_maddrs: tuple[str, ...] = ()
    client_mode: bool = False
    extra_spec: dict[str, Any] = field(default_factory=dict)


def prompt_texts(path: Path) -> list[str] | None:
    """Seed 000's prompts.json (a JSON list of strings) as texts; None for the documented data formats."""
    if path.suffix != ".json":
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the data readers report the problem with its place
    if isinstance(document, list) and document and all(isinstance(x, str) for x in document):
        return document
    return None


def training_file(prompts_file: str, folder: Path) -> tuple[str, int]:
    """A file the data readers accept, and how many records it has (strings become prompt-only records)."""
    from decentralized_verl.data import load_prompts

    path = Path(prompts_file).expanduser()
    if not path.is_file():
        raise VolunteerError(f"--prompts-file: {prompts_file} is not a file")
    texts = prompt_texts(path)
    if texts is not None:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "prompts.jsonl"
        target.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
        return str(target), len(texts)
    return str(path.resolve()), len(load_prompts(path))


def build_spec(options: QuickstartOptions, model_path: str, train_file: str, n_prompts: int):
    """The RLHFJob spec the flags mean (validated like any manifest)."""
    from decentralized_verl.manifest import parse_spec

    algorithm = options.algorithm
    n = options.samples_per_prompt or (4 if algorithm in GROUP_ALGORITHMS else 1)
    batch = max(1, min(options.batch_size, n_prompts))
    steps = max(1, n_prompts // batch) * options.num_epochs
    spec: dict[str, Any] = {
        "model": {"path": model_path},
        "algorithm": {"name": algorithm, "samplesPerPrompt": n},
        "data": {
            "train": train_file,
            "rewardType": options.reward_type,
            "maxNewTokens": options.max_new_tokens,
        },
        "roles": {"rollout": {"replicas": 0}, "learner": {"replicas": 1}},
        "training": {
            "steps": steps,
            "batchSize": batch,
            "learningRate": options.learning_rate,
            "seed": options.seed,
        },
    }
    if algorithm == "ppo":
        spec["roles"]["critic"] = {"replicas": 0}
    if options.reward_model:
        spec["data"]["rewardType"] = "reward_model"
        spec["data"]["rewardModel"] = {"path": options.reward_model}
    for key, value in options.extra_spec.items():
        spec.setdefault(key, {}).update(value)
    return parse_spec(spec)


async def find_workers(dht, job: str, *, need_critic: bool, timeout: float, poll_s: float = 0.5):
    """(actor records, critic records) once at least one actor (and a critic, for PPO) is announced."""
    from decentralized_verl.volunteers.announce import job_key, read_records

    deadline = time.monotonic() + timeout
    while True:
        records, _ = await read_records(dht, job)
        actors = [r for r in records if r.role in ("actor", "rollout")]
        critics = sorted((r for r in records if r.role == "critic"), key=lambda r: r.started_at)
        if actors and (critics or not need_critic):
            return actors, critics
        if time.monotonic() >= deadline:
            missing = "actor" if not actors else "critic (PPO needs one)"
            raise VolunteerError(
                f"no {missing} announced under {job_key(job)} after {timeout:g}s; start "
                "`dverl-worker --initial-peers ... --model PATH --role actor|critic` first"
            )
        await asyncio.sleep(poll_s)


async def run_quickstart(options: QuickstartOptions) -> dict[str, Any]:
    """Discover, train, and return the summary (also written to OUTPUT/summary.json)."""
    from decentralized_verl.data import PromptSampler
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.roles import local, scoring
    from decentralized_verl.roles.coordinator import Coordinator, LoopParts
    from decentralized_verl.roles.dispatch import Dispatcher
    from decentralized_verl.roles.progress import MetricsLog, ProgressState
    from decentralized_verl.roles.prompts import prepare_prompts
    from decentralized_verl.roles.trainer import PolicyTrainer, rollout_state_dict
    from decentralized_verl.transport import messages as m
    from decentralized_verl.transport.weight_service import WeightPublisher
    from decentralized_verl.volunteers.critic import P2PCriticClient
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht
    from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
    from decentralized_verl.volunteers.p2p import CoordinatorEndpoints, connect
    from decentralized_verl.volunteers.verify import DEFAULT_ATOL, PublishedPolicy, Verifier

    if options.num_epochs < 1:
        raise VolunteerError(f"--num-epochs: must be >= 1 (got {options.num_epochs})")
    if not 0.0 <= options.verify_fraction <= 1.0:
        raise VolunteerError(f"--verify-fraction: must be in [0, 1] (got {options.verify_fraction})")
    output = Path(options.output or f"runs/{options.job}").expanduser()
    output.mkdir(parents=True, exist_ok=True)
    train_file, n_prompts = training_file(options.prompts_file, output)
    peer_options = PeerOptions(
        initial_peers=options.initial_peers,
        host_maddrs=options.host_maddrs or (f"/ip4/0.0.0.0/tcp/{options.port}",),
        announce_maddrs=options.announce_maddrs,
        client_mode=options.client_mode,
    )
    dht = await asyncio.to_thread(start_dht, peer_options)
    hub = None
    try:
        p2p = await dht.replicate_p2p()
        actors, critics = await find_workers(
            dht, options.job, need_critic=options.algorithm == "ppo", timeout=options.wait_workers_s
        )
        model_path = options.model or next((a.model for a in actors if a.model), "")
        if not model_path or not Path(model_path).is_dir():
            raise VolunteerError(
                f"no local model folder (announced: {model_path or 'none'}); pass --model PATH"
            )
        spec = build_spec(options, model_path, train_file, n_prompts)
        model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, spec.model)
        trainer = PolicyTrainer(model, spec)
        publisher = WeightPublisher(dtype=None)
        publisher.publish(rollout_state_dict(model), 0)
        progress = ProgressState()
        dispatcher = Dispatcher([])
        verifier = None
        if options.verify_fraction > 0:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            policy = PublishedPolicy(
                copy.deepcopy(model), publisher, trainer.settings.temperature, tokenizer.pad_token_id
            )
            verifier = Verifier(
                policy,
                fraction=options.verify_fraction,
                atol=DEFAULT_ATOL.get(dtype, 0.25),
                seed=spec.training.seed,
            )
        vocab = getattr(model.config, "vocab_size", None)
        hub = VolunteerHub(
            HubConfig(
                job=options.job, secret=b"", open=True, poll_s=1.0, limits=m.WireLimits(vocab_size=vocab)
            ),
            dispatcher,
            p2p=p2p,
            dht=dht,
            publisher=publisher,
            verifier=verifier,
            progress=progress,
        )

        def refuse_join(request: m.JoinRequest, caller: str) -> m.JoinReply:
            return m.JoinReply(False, reason="this is an open quick-start job: announce, do not join")

        endpoints = CoordinatorEndpoints(
            p2p,
            admit=refuse_join,
            is_admitted=lambda peer_id: peer_id in hub.peers and peer_id not in hub.blocked,
            publisher=publisher,
            spec_json=spec.model_dump_json(by_alias=True, exclude_none=True),
        )
        await endpoints.register()
        await hub.poll_once()
        hub.start()
        critic = None
        if spec.roles.critic is not None:
            await connect(p2p, critics[0].peer_id, critics[0].maddrs)
            critic = P2PCriticClient(p2p, critics[0].peer_id)
        prompts = prepare_prompts(spec, tokenizer, train_file, None)
        metrics = MetricsLog(output / "metrics.jsonl")
        total = spec.training.steps

        def on_step(record: dict[str, Any]) -> None:
            shown = ", ".join(
                f"{k}={record[k]:.4g}"
                for k in ("reward_mean", "pg_loss", "critic_loss", "step_seconds")
                if isinstance(record.get(k), float)
            )
            print(f"step {record['step']}/{total}: {shown}", flush=True)

        parts = LoopParts(
            spec=spec,
            trainer=trainer,
            dispatcher=dispatcher,
            reward=local.LocalRewardClient(scoring.RewardWorker.from_spec(spec)),
            reference=None,
            critic=critic,
            prompts=prompts,
            eval_prompts=[],
            sampler=PromptSampler(
                len(prompts), spec.training.batch_size, seed=spec.training.seed, drop_last=True
            ),
            pad_token_id=tokenizer.pad_token_id,
            publish=lambda version: publisher.publish(rollout_state_dict(model), version),
            progress=progress,
            metrics=metrics,
            on_step=on_step,
        )
        print(
            f"training {options.algorithm} on {len(prompts)} prompts for {options.num_epochs} epochs "
            f"({total} steps) with {len(actors)} actor(s)"
            + (f" and critic {critics[0].peer_id}" if critic is not None else ""),
            flush=True,
        )
        try:
            summary = await Coordinator(parts).run()
        finally:
            metrics.close()
        report = hub.report()
        summary.update(
            epochs=options.num_epochs,
            actors=sorted(report["samples"]),
            actor_samples=report["samples"],
            critic=critics[0].peer_id if critic is not None else None,
            verified_samples=report["verified_samples"],
            blocked=report["blocked"],
        )
        (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary
    finally:
        if hub is not None:
            await hub.close(output)
        dht.shutdown()


def format_summary(summary: dict[str, Any]) -> str:
    used = ", ".join(
        f"{p[-8:]}: {s['accepted']} samples" for p, s in summary.get("actor_samples", {}).items()
    )
    return (
        f"training finished: {summary['steps']} steps ({summary['epochs']} epochs) in "
        f"{summary['seconds']:.1f}s; reward {summary['reward_first']:.4f} -> {summary['reward_last']:.4f}; "
        f"policy version {summary['policy_version']}; actors [{used}]; "
        f"verified samples {summary['verified_samples']}, blocked peers {len(summary['blocked'])}"
    )


def main_quickstart(options: QuickstartOptions) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = asyncio.run(run_quickstart(options))
    print(format_summary(summary), flush=True)
    return 0
