"""The coordinator's side of volunteering: join the job's DHT under the identity only the secret's holder
has, serve join, spec and weights over P2P, and run the `VolunteerHub` that adds admitted volunteers to
dispatch. `join_volunteers` is the loop attachment the learner uses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from decentralized_verl.security.peer_identity import bootstrap_maddr, coordinator_seed
from decentralized_verl.security.trust import process_credentials
from decentralized_verl.settings import WorkerSettings, env_name
from decentralized_verl.spans.roster import start_span_roster
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.delta_p2p import DeltaEndpoint
from decentralized_verl.transport.p2p import CoordinatorEndpoints, listen_maddrs
from decentralized_verl.transport.weights.delta_publish import DeltaPublisher
from decentralized_verl.volunteers.admission import ADMISSION_FILE
from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord
from decentralized_verl.volunteers.dht import PeerOptions, start_dht
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.tokens import TokenError, load_secret
from decentralized_verl.volunteers.verify import episode_check, verifier_for

if TYPE_CHECKING:
    from decentralized_verl.orchestration.assemble import Attachment, Closer, LoopContext

log = logging.getLogger(__name__)


def job_secret(settings: WorkerSettings) -> bytes:
    """The join secret: DVERL_JOIN_SECRET_FILE (a mounted Secret) or DVERL_JOIN_SECRET."""
    if settings.join_secret_file:
        return load_secret(secret_file=settings.join_secret_file)
    if settings.join_secret is None:
        raise TokenError(f"environment variable {env_name('join_secret')} is not set")
    return load_secret(secret_value=settings.join_secret)


async def start_volunteer_discovery(
    spec,
    job: str,
    dispatcher,
    settings: WorkerSettings,
    *,
    model,
    publisher,
    status,
    temperature: float,
    pad_token_id: int,
    start_version: int = 0,
    tokenizer=None,
    admission: Path | None = None,
    resumed: bool = False,
) -> VolunteerHub:
    """Join the job's DHT as the coordinator, serve join/spec/weights over P2P and start discovery.
    With the `tokenizer`, a multi-turn job's volunteer episodes are rebuilt when checked.

    `admission`: the file the hub keeps its admission state in (redeemed tokens, blocks, each token's
    history), written whenever it changes and taken up when the learner `resumed` a checkpoint, so a
    blocked volunteer stays blocked across a learner restart.
    From the settings: the bootstrap's address, the join secret, where to listen and what to announce, and
    optionally how many volunteers to wait for before training starts (tests and benchmarks).
    """
    secret = job_secret(settings)
    addr = settings.dht_addr
    host = settings.bind_host or "127.0.0.1"
    credentials = process_credentials()
    options = PeerOptions(
        initial_peers=(bootstrap_maddr(addr, credentials.dht_peer if credentials is not None else None),),
        host_maddrs=(f"/ip4/{host}/tcp/0",),
        announce_maddrs=settings.p2p_announce,
        identity_seed=coordinator_seed(secret, job),
        signed_job=job,
    )
    dht = await asyncio.to_thread(start_dht, options)
    p2p = await dht.replicate_p2p()
    if publisher.latest_version is None:
        publisher.publish(rollout_state_dict(model), start_version)
    volunteers = spec.volunteers
    verifier = verifier_for(
        model,
        publisher,
        temperature=temperature,
        pad_token_id=pad_token_id,
        fraction=volunteers.verify_fraction,
        atol=settings.verify_atol,
        episodes=episode_check(spec, tokenizer, model) if tokenizer is not None else None,
        replay_draws=spec.roles.rollout.backend_kind.replayable_draws,
    )
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    config = HubConfig(
        job=job,
        secret=secret,
        roles=tuple(volunteers.roles),
        max_volunteers=volunteers.max_volunteers,
        poll_s=settings.volunteer_poll_s,
        limits=m.WireLimits(vocab_size=vocab),
    )
    hub = VolunteerHub(
        config, dispatcher, p2p=p2p, dht=dht, publisher=publisher, verifier=verifier, status=status
    )
    if admission is not None:
        hub.keep_admission(admission, restore=resumed)
    endpoints = CoordinatorEndpoints(
        p2p,
        admit=hub.admit,
        is_admitted=hub.is_admitted,
        publisher=publisher,
        spec_json=spec.model_dump_json(by_alias=True, exclude_none=True),
    )
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if layers is not None:  # before the join handler: an admitted span volunteer asks for its span at once
        await start_span_roster(spec, job, hub, p2p, int(layers))
    await endpoints.register()
    if isinstance(publisher, DeltaPublisher):
        await DeltaEndpoint(p2p, publisher, hub.is_admitted).register()
        hub._closers.append(publisher.close)
    hub._closers.append(dht.shutdown)
    hub._closers.insert(0, (await _announce_coordinator(dht, job, settings)).stop)  # before the DHT goes
    hub.start()
    log.info("volunteer discovery for job %s: coordinator peer %s, bootstrap %s", job, dht.peer_id, addr)
    wait = settings.volunteer_wait()
    if wait:
        got = await hub.wait_for(*wait)
        log.info("%d volunteers active before training starts", got)
    return hub


async def _announce_coordinator(dht, job: str, settings: WorkerSettings):
    """Keep a signed record of where the coordinator listens: a volunteer whose libp2p routing cannot find
    the coordinator's peer id (its routing table lost the bootstrap, or it asked before the coordinator
    joined) dials these addresses instead. Only the coordinator's key can sign a record under its id."""
    me, maddrs = dht.peer_id.to_base58(), listen_maddrs(dht)

    def record(expires_at: float) -> VolunteerRecord:
        return VolunteerRecord(me, "coordinator", "", 0.0, 0, expires_at, maddrs=maddrs)

    heartbeat = Heartbeat(dht, job, record, interval=settings.volunteer_poll_s * 2 + 1.0, ttl=30.0)
    await heartbeat.beat()
    heartbeat.start()
    return heartbeat


def join_volunteers(publisher, output: Path, settings: WorkerSettings) -> Attachment:
    """Loop attachment: with volunteers enabled and a DHT in the plan, volunteers found there join dispatch
    and every new policy version reaches the publisher they pull from; `volunteers.json` on the way out."""

    async def attach(context: LoopContext) -> Closer | None:
        if not (context.spec.volunteers.enabled and settings.dht_addr):
            return None
        model = context.trainer.model
        hub = await start_volunteer_discovery(
            context.spec,
            context.job,
            context.dispatcher,
            settings,
            model=model,
            publisher=publisher,
            status=context.status,
            temperature=context.trainer.settings.temperature,
            pad_token_id=context.tokenizer.pad_token_id,
            start_version=context.start_version,
            tokenizer=context.tokenizer,
            admission=output / ADMISSION_FILE,
            resumed=context.resumed,
        )
        context.roles.publish = hub.wrap_publish(context.roles.publish, model)
        return functools.partial(hub.close, output)

    return attach
