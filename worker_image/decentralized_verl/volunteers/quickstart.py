"""`dverl-train --initial-peers MADDR --prompts-file prompts.json --algorithm ppo --num-epochs N`.

Seed 000's quick start on the runtime: the trainer joins the DHT, finds the open job's actor and critic
workers (open_worker.py) by their announcements alone, builds a JobSpec from the flags and runs the same
`Coordinator` loop as `dverl run`. The trainer is the learner and coordinator: it holds the policy,
serves its weights over P2P to the actors it found (and nobody else), generates through them with
throughput-weighted dispatch and re-dispatch (VolunteerHub in open mode), asks the critic peer for
values and value updates (PPO). A fraction of every actor batch is re-checked against the trainer's own
policy (`--verify-fraction`), as for token-admitted volunteers.

Reward and reference volunteers (`dverl-worker --role reward|reference`) are used when announced:
rewards from the first reward peer (for `reward_model`, only one serving the same reward-model folder),
reference log-probs for the KL term (when `kl_coef > 0`) from a peer serving this trainer's own model
folder at its temperature. Anything else, or a call that fails, is computed in the trainer
(fallback.py). Trusting a peer's rewards is what makes this the open, trusted-network mode; the
RLHFJob flow scores on the trusted side only.
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
    kl_coef: float = 0.0
    """> 0 adds the KL term against the initial policy (a reference volunteer computes it when found)."""
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
    if options.kl_coef > 0:
        spec["algorithm"]["klCoef"] = options.kl_coef
        spec["roles"]["reference"] = {"replicas": 0}
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


def _same_folder(a: str, b: str) -> bool:
    return bool(a) and bool(b) and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def pick_reward_peer(records, spec) -> tuple[Any | None, str]:
    """(the reward record to use or None, why) for the job's reward type."""
    peers = sorted((r for r in records if r.role == "reward"), key=lambda r: r.started_at)
    if not peers:
        return None, "no reward volunteer announced"
    if spec.data.reward_type == "reward_model":
        wanted = spec.data.reward_model.path if spec.data.reward_model else ""
        peers = [r for r in peers if _same_folder(r.model, wanted or "")]
        if not peers:
            return None, f"no reward volunteer serves the reward model {wanted}"
    return peers[0], f"reward volunteer {peers[0].peer_id}"


def pick_reference_peer(records, model_path: str, temperature: float) -> tuple[Any | None, str]:
    """(the reference record to use or None, why): it must serve this model folder at this temperature."""
    peers = sorted((r for r in records if r.role == "reference"), key=lambda r: r.started_at)
    if not peers:
        return None, "no reference volunteer announced"
    same = [r for r in peers if _same_folder(r.model, model_path)]
    if not same:
        return (
            None,
            f"reference volunteers serve other models ({', '.join(sorted({r.model for r in peers}))})",
        )
    matching = [r for r in same if abs(r.temperature - temperature) < 1e-9]
    if not matching:
        return (
            None,
            f"reference volunteers compute at temperature {same[0].temperature:g}, not {temperature:g}",
        )
    return matching[0], f"reference volunteer {matching[0].peer_id}"


async def scoring_roles(p2p, dht, spec, *, job: str, model_path: str, temperature: float, pad_token_id):
    """(reward client, reference client or None, description lines): volunteers when usable, else local."""
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.roles import local, scoring
    from decentralized_verl.volunteers.announce import read_records
    from decentralized_verl.volunteers.fallback import FallbackReference, FallbackReward
    from decentralized_verl.volunteers.p2p import connect
    from decentralized_verl.volunteers.reference_role import P2PReferenceClient
    from decentralized_verl.volunteers.reward_role import P2PRewardClient

    records, _ = await read_records(dht, job)
    lines = []
    chosen, why = pick_reward_peer(records, spec)
    remote = None
    if chosen is not None:
        await connect(p2p, chosen.peer_id, chosen.maddrs)
        remote = P2PRewardClient(p2p, chosen.peer_id)
    lines.append(f"rewards: {why}" + ("" if chosen else "; computed by the trainer"))
    reward = FallbackReward(remote, lambda: local.LocalRewardClient(scoring.RewardWorker.from_spec(spec)))
    reference = None
    if spec.roles.reference is not None:
        chosen, why = pick_reference_peer(records, model_path, temperature)
        remote = None
        if chosen is not None:
            await connect(p2p, chosen.peer_id, chosen.maddrs)
            remote = P2PReferenceClient(p2p, chosen.peer_id)
        lines.append(f"reference log-probs: {why}" + ("" if chosen else "; computed by the trainer"))

        def make_local():
            # The initial policy from disk (the trainer's own model has moved on by the time this runs).
            model, _ = load_model_and_tokenizer(spec.model)
            return local.LocalReferenceClient(
                scoring.ReferenceWorker(model, temperature, pad_token_id=pad_token_id)
            )

        reference = FallbackReference(remote, make_local)
    return reward, reference, lines


async def run_quickstart(options: QuickstartOptions) -> dict[str, Any]:
    """Discover, train, and return the summary (also written to OUTPUT/summary.json)."""
    from decentralized_verl.data import PromptSampler
    from decentralized_verl.models.loading import load_model_and_tokenizer
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
        reward, reference, scoring_lines = await scoring_roles(
            p2p,
            dht,
            spec,
            job=options.job,
            model_path=model_path,
            temperature=trainer.settings.temperature,
            pad_token_id=tokenizer.pad_token_id,
        )
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
            reward=reward,
            reference=reference,
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
        for line in scoring_lines:
            print(line, flush=True)
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
            reward_peer=getattr(reward.remote, "peer_id", None),
            reward_calls=reward.report(),
            reference_peer=getattr(reference.remote, "peer_id", None) if reference else None,
            reference_calls=reference.report() if reference else None,
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
