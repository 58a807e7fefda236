"""`dverl-train --initial-peers MADDR --prompts-file prompts.json --algorithm ppo --num-epochs N`.

The DHT quick start on the runtime: the trainer joins the DHT, finds the open job's actor and critic
workers (open_volunteer.py) by their announcements alone, builds a JobSpec from the flags and runs the same
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
import dataclasses
import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decentralized_verl.core.status import StatusBoard
from decentralized_verl.data import load_prompts
from decentralized_verl.entrypoints.open_volunteer import OPEN_JOB
from decentralized_verl.entrypoints.quickstart_scoring import scoring_roles
from decentralized_verl.errors import VolunteerError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.orchestration.assemble import build_loop
from decentralized_verl.orchestration.prompts import prepare_prompts
from decentralized_verl.orchestration.wiring import RoleClients
from decentralized_verl.runtime.cpus import configure_from_environment
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.trainer import PolicyTrainer, rollout_state_dict
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.clients import P2PCriticClient
from decentralized_verl.transport.p2p import CoordinatorEndpoints, connect
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.volunteers.dht import start_dht
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.open_peers import find_workers
from decentralized_verl.volunteers.rewards import QUICKSTART_REWARD
from decentralized_verl.volunteers.session import PeerReach
from decentralized_verl.volunteers.verify import verifier_for

if TYPE_CHECKING:
    from decentralized_verl.orchestration.assemble import Closer, LoopContext

log = logging.getLogger(__name__)

GROUP_ALGORITHMS = ("grpo", "dapo", "rloo")


@dataclass(frozen=True)
class QuickstartOptions(PeerReach):
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
    extra_spec: dict[str, Any] = field(default_factory=dict)


def prompt_texts(path: Path) -> list[str] | None:
    """A prompts.json (a JSON list of strings) as texts; None for the documented data formats."""
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


async def run_quickstart(options: QuickstartOptions) -> dict[str, Any]:
    """Discover, train, and return the summary (also written to OUTPUT/summary.json)."""
    _check_options(options)
    output = Path(options.output or f"runs/{options.job}").expanduser()
    output.mkdir(parents=True, exist_ok=True)
    train_file, n_prompts = training_file(options.prompts_file, output)
    dht = await asyncio.to_thread(
        start_dht, dataclasses.replace(options.peer_options(), signed_job=options.job)
    )
    try:
        p2p = await dht.replicate_p2p()
        actors, critics = await find_workers(
            dht, options.job, need_critic=options.algorithm == "ppo", timeout=options.wait_workers_s
        )
        model_path = _model_folder(options, actors)
        spec = build_spec(options, model_path, train_file, n_prompts)
        model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, spec.model)
        trainer = PolicyTrainer(model, spec)
        publisher = WeightPublisher(dtype=None)
        publisher.publish(rollout_state_dict(model), 0)
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
        roles = RoleClients(
            rollout=[],  # the open actors join through the hub
            priors={},
            publish=lambda version: publisher.publish(rollout_state_dict(model), version),
            reward=reward,
            reference=reference,
            critic=critic,
        )
        total = spec.training.steps
        status = StatusBoard()
        actors_hub = OpenActors(p2p, dht, publisher, options)
        prompts = prepare_prompts(spec, tokenizer, train_file, None)
        loop = await build_loop(
            spec,
            trainer,
            tokenizer,
            roles,
            job=options.job,
            output=output,
            prompts=prompts,
            status=status,
            on_step=functools.partial(_print_step, total=total),
            attach=(actors_hub,),
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
            summary = await loop.run()
            report = actors_hub.hub.report()
        finally:
            await loop.close()
        critic_peer = critics[0].peer_id if critic is not None else None
        summary.update(_volunteer_report(options, report, critic_peer, reward, reference))
        (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary
    finally:
        dht.shutdown()


def _check_options(options: QuickstartOptions) -> None:
    """Refuse flags no run could use before joining the DHT, naming the flag."""
    if options.num_epochs < 1:
        raise VolunteerError(f"--num-epochs: must be >= 1 (got {options.num_epochs})")
    if not 0.0 <= options.verify_fraction <= 1.0:
        raise VolunteerError(f"--verify-fraction: must be in [0, 1] (got {options.verify_fraction})")


def _model_folder(options: QuickstartOptions, actors: list[Any]) -> str:
    """The policy's model folder: `--model`, else the one the first actor announces, which the trainer
    must also have locally (it trains that model and re-checks the actors' samples against it)."""
    model_path = options.model or next((a.model for a in actors if a.model), "")
    if not model_path or not Path(model_path).is_dir():
        raise VolunteerError(f"no local model folder (announced: {model_path or 'none'}); pass --model PATH")
    return model_path


def _print_step(record: dict[str, Any], *, total: int) -> None:
    """One line per finished step on stdout: the quick start is watched in a terminal, without a bar."""
    shown = ", ".join(
        f"{k}={record[k]:.4g}"
        for k in ("reward_mean", "pg_loss", "critic_loss", "step_seconds")
        if isinstance(record.get(k), float)
    )
    print(f"step {record['step']}/{total}: {shown}", flush=True)


def _volunteer_report(
    options: QuickstartOptions, report: dict[str, Any], critic_peer: str | None, reward: Any, reference: Any
) -> dict[str, Any]:
    """Who did the work, for the summary: in an open network the peers are strangers, so the run says
    which actors produced samples, how many were re-checked or blocked, and which peers scored them."""
    return {
        "epochs": options.num_epochs,
        "actors": sorted(report["samples"]),
        "actor_samples": report["samples"],
        "critic": critic_peer,
        "verified_samples": report["verified_samples"],
        "blocked": report["blocked"],
        "reward_peer": getattr(reward.remote, "peer_id", None),
        "reward_calls": reward.report(),
        "reference_peer": getattr(reference.remote, "peer_id", None) if reference else None,
        "reference_calls": reference.report() if reference else None,
    }


class OpenActors:
    """Loop attachment: the open job's actors, found by their DHT announcements, join dispatch (VolunteerHub
    in open mode); the trainer serves its weights to them over P2P and re-checks a share of their samples."""

    def __init__(self, p2p, dht, publisher, options: QuickstartOptions) -> None:
        self.p2p, self.dht, self.publisher, self.options = p2p, dht, publisher, options
        self.hub = None
        """The VolunteerHub, once attached (its report goes into the summary)."""

    async def __call__(self, context: LoopContext) -> Closer:
        model = context.trainer.model
        verifier = verifier_for(
            model,
            self.publisher,
            temperature=context.trainer.settings.temperature,
            pad_token_id=context.tokenizer.pad_token_id,
            fraction=self.options.verify_fraction,
        )
        vocab = getattr(model.config, "vocab_size", None)
        hub = VolunteerHub(
            HubConfig(
                job=self.options.job, secret=b"", open=True, poll_s=1.0, limits=m.WireLimits(vocab_size=vocab)
            ),
            context.dispatcher,
            p2p=self.p2p,
            dht=self.dht,
            publisher=self.publisher,
            verifier=verifier,
            status=context.status,
        )
        self.hub = hub

        def refuse_join(request: m.JoinRequest, caller: str) -> m.JoinReply:
            return m.JoinReply(False, reason="this is an open quick-start job: announce, do not join")

        endpoints = CoordinatorEndpoints(
            self.p2p,
            admit=refuse_join,
            is_admitted=lambda peer_id: peer_id in hub.peers and peer_id not in hub.blocked,
            publisher=self.publisher,
            spec_json=context.spec.model_dump_json(by_alias=True, exclude_none=True),
        )
        await endpoints.register()
        await hub.poll_once()
        hub.start()
        output = Path(self.options.output or f"runs/{self.options.job}").expanduser()
        return functools.partial(hub.close, output)


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


def main_quickstart(options: QuickstartOptions, settings: WorkerSettings) -> int:
    configure_from_environment(settings)  # this process trains: torch sized to its cores
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = asyncio.run(run_quickstart(options))
    print(format_summary(summary), flush=True)
    return 0
