"""The open quick-start worker: `dverl-worker --initial-peers MADDR --model PATH --role ROLE`.

ROLE is actor (rollout), critic, reward or reference.

Trust model (the "open" job): no join token. The worker announces itself under the open job's DHT key
(`dverl/<job>/volunteers`, job `quickstart` unless `--job` names another) and serves any trainer that
calls it. That is for networks where every peer is trusted (a lab, one person's machines); on an open
network use the token-checked path (`dverl worker --job NAME --token TOKEN`, worker.py), which only
serves the coordinator named in the token. The trainer side still validates every answer (shapes,
versions, NaNs) and re-checks a fraction of an actor's log-probs (`dverl-train --verify-fraction`).

- actor (= rollout): loads PATH (tokenizer and architecture), then pulls the trainer's weights over
  P2P (chunks, hash-checked) before its first batch and after every update; it follows one trainer at
  a time and re-binds to another one only after `rebind_after_s` without requests.
- critic: a value model built from PATH, trained in place by the trainer's Train calls.
- reward: scores (prompt, completion) pairs with the reward each request names (only rewards
  shipped with the package, see rewards/servable.py; `reward_model` when PATH is a reward
  model). Open mode only: the token-checked RLHFJob flow never takes rewards from a volunteer.
- reference: log-probs of response tokens under PATH (the initial policy) at temperature 1.0, for the
  trainer's KL term; the trainer uses it only when PATH is its own model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.errors import VolunteerError
from decentralized_verl.models.loading import load_model_and_tokenizer, load_sequence_classifier
from decentralized_verl.rewards import RewardModelScorer
from decentralized_verl.rewards.servable import is_reward_model_folder
from decentralized_verl.runtime.lifecycle import serve_until_stopped
from decentralized_verl.serving.p2p_endpoints import (
    CriticEndpoint,
    ReferenceEndpoint,
    RewardEndpoint,
    RolloutEndpoint,
)
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.scoring import CriticWorker, ReferenceWorker, RewardWorker
from decentralized_verl.spec import ModelSpec
from decentralized_verl.spec.catalogue.backends import HF
from decentralized_verl.training.value_model import build_value_model
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import p2p as wire
from decentralized_verl.volunteers.announce import VolunteerRecord, hardware_summary
from decentralized_verl.volunteers.session import PeerReach, volunteer_session

log = logging.getLogger(__name__)

OPEN_JOB = "quickstart"
OPEN_ROLES = ("actor", "rollout", "critic", "reward", "reference")
REFERENCE_TEMPERATURE = 1.0


@dataclass(frozen=True)
class OpenWorkerOptions(PeerReach):
    model: str
    role: str = "actor"
    job: str = OPEN_JOB
    heartbeat_s: float = 5.0
    ttl_s: float = 20.0
    rebind_after_s: float = 60.0


class CallerBinding:
    """Which trainer an open actor follows: the first caller, until it has been idle `idle_s`."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.bound: str | None = None
        self.last_seen = 0.0

    def accept(self, caller: str, now: float) -> bool:
        """True when `caller` becomes a newly bound trainer (its weights must be loaded)."""
        if self.bound == caller:
            self.last_seen = now
            return False
        if self.bound is not None and now - self.last_seen < self.idle_s:
            raise wire.Unauthorized(
                f"busy: serving trainer {self.bound} (free again {self.idle_s:g}s after its last request)"
            )
        rebound = self.bound is not None
        self.bound, self.last_seen = caller, now
        return rebound


def _model_spec(path: str):
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise VolunteerError(
            f"--model: {path!r} is not a local model folder (config.json, tokenizer, weights)"
        )
    return ModelSpec(path=str(folder.resolve()))


async def _serve_actor(p2p, me: str, options: OpenWorkerOptions):
    model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, _model_spec(options.model))
    backend = make_backend(HF, model, tokenizer, seed=0, version=-1)
    source = wire.P2PWeightSource(p2p, "", asyncio.get_running_loop())
    worker = RolloutWorker(backend, f"actor-{me[-8:]}", source, backend_name=HF.name)
    binding = CallerBinding(options.rebind_after_s)

    async def follow(caller: str) -> None:
        rebound = binding.accept(caller, time.monotonic())
        source.coordinator = caller
        if rebound:  # another trainer: its versions mean other weights, load its newest now
            version, state = await source.fetch_latest_async(0)
            await asyncio.to_thread(worker.load_weights, state, version)

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    endpoint = RolloutEndpoint(
        p2p, worker, coordinator=None, limits=m.WireLimits(vocab_size=vocab), on_caller=follow
    )
    await endpoint.register()

    def stats() -> tuple[float, int, str]:
        return (
            float(worker.tokens_per_second),
            int(worker.version),
            (
                f"served {endpoint.samples} samples in {endpoint.requests} requests, "
                f"received {source.bytes_received} weight bytes"
            ),
        )

    return stats


async def _serve_critic(p2p, me: str, options: OpenWorkerOptions):
    critic, tokenizer = await asyncio.to_thread(build_value_model, _model_spec(options.model))
    worker = CriticWorker(critic, None, pad_token_id=tokenizer.pad_token_id, worker_id=f"critic-{me[-8:]}")
    endpoint = CriticEndpoint(p2p, worker, coordinator=None, limits=m.WireLimits(vocab_size=len(tokenizer)))
    await endpoint.register()

    def stats() -> tuple[float, int, str]:
        return (
            0.0,
            int(worker.version),
            (f"served {endpoint.values_requests} values requests and {endpoint.train_steps} train steps"),
        )

    return stats


async def _serve_reward(p2p, me: str, options: OpenWorkerOptions):
    folder = _model_spec(options.model).path
    scorer = None
    if is_reward_model_folder(folder):
        model, tokenizer = await asyncio.to_thread(load_sequence_classifier, folder, field="--model")
        scorer = RewardModelScorer(model, tokenizer)
    worker = RewardWorker(None, scorer)
    worker.worker_id = f"reward-{me[-8:]}"
    endpoint = RewardEndpoint(p2p, worker, has_reward_model=scorer is not None)
    await endpoint.register()

    def stats() -> tuple[float, int, str]:
        return 0.0, 0, f"served {endpoint.requests} score requests ({endpoint.items} completions)"

    return stats


async def _serve_reference(p2p, me: str, options: OpenWorkerOptions):
    model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, _model_spec(options.model))
    worker = ReferenceWorker(
        model, REFERENCE_TEMPERATURE, pad_token_id=tokenizer.pad_token_id, worker_id=f"reference-{me[-8:]}"
    )
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    endpoint = ReferenceEndpoint(p2p, worker, limits=m.WireLimits(vocab_size=vocab))
    await endpoint.register()

    def stats() -> tuple[float, int, str]:
        return 0.0, 0, f"served {endpoint.requests} log-prob requests ({endpoint.sequences} sequences)"

    return stats


async def run_open_worker(options: OpenWorkerOptions, *, stop: asyncio.Event | None = None) -> int:
    """Join the DHT, serve the role, announce it with a heartbeat; run until `stop` or a signal."""
    if options.role not in OPEN_ROLES:
        raise VolunteerError(
            f"--role {options.role}: an open quick-start worker serves actor, critic, reward or reference "
            "(learners: --role learner --data FILE)"
        )
    role = "actor" if options.role == "rollout" else options.role
    began = time.perf_counter()
    async with volunteer_session(options) as session:
        p2p = await session.p2p()
        me = session.me
        serve = {
            "actor": _serve_actor,
            "critic": _serve_critic,
            "reward": _serve_reward,
            "reference": _serve_reference,
        }[role]
        stats = await serve(p2p, me, options)
        hardware = hardware_summary()
        started = time.time()
        model_path = str(Path(options.model).expanduser().resolve())
        maddrs = wire.listen_maddrs(session.dht)

        def record(expires_at: float) -> VolunteerRecord:
            tokens_per_second, version, _ = stats()
            return VolunteerRecord(
                peer_id=me,
                role=role,
                hardware=hardware,
                tokens_per_second=tokens_per_second,
                policy_version=version,
                expires_at=expires_at,
                started_at=started,
                model=model_path,
                maddrs=maddrs,
                temperature=REFERENCE_TEMPERATURE,
            )

        await session.announce(record)
        ready = (
            f"worker {me} serves {role} for open job {options.job!r} (model {model_path}), ready in "
            f"{time.perf_counter() - began:.2f}s; open mode: any trainer on this DHT may use it "
            "(trusted networks only)"
        )
        return await serve_until_stopped(
            ready, served=lambda: f"worker {me} ({role}) {stats()[2]}", stop=stop
        )


def main_open_worker(options: OpenWorkerOptions) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_open_worker(options))
