"""The volunteer process: `dverl worker --initial-peers MADDR --job NAME --token TOKEN --role rollout`.

join the job's DHT -> send the token to the coordinator named in it (authenticated P2P) -> fetch the
job's spec and the current weights (chunks, hash-checked) -> serve generation over a P2P stream
handler -> announce role, hardware, measured tokens/s and policy version with a heartbeat.
The volunteer never holds the job secret or any cluster credential; it runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.errors import PeerUnavailable, VolunteerError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.runtime.lifecycle import serve_until_stopped
from decentralized_verl.serving.p2p_endpoints import RolloutEndpoint
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spans.volunteer import serve_for_job
from decentralized_verl.spec import JobSpec
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import p2p as wire
from decentralized_verl.transport.delta_p2p import DeltaP2PWeightSource
from decentralized_verl.volunteers.announce import (
    VolunteerRecord,
    admitted_key,
    hardware_summary,
    read_records,
)
from decentralized_verl.volunteers.prefetch import WeightPrefetch
from decentralized_verl.volunteers.session import JOB_MUST_RUN, PeerReach, volunteer_session
from decentralized_verl.volunteers.tokens import TokenError, read_claims

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolunteerOptions(PeerReach):
    job: str
    token: str
    role: str = "rollout"
    model: str | None = None
    """A local model path overriding the job's model source (same architecture; weights still come
    from the coordinator)."""
    heartbeat_s: float = 5.0
    ttl_s: float = 20.0
    join_timeout_s: float = 300.0
    vllm_eager: bool = False
    """A vllm rollout engine starts without torch.compile (`WorkerSettings.vllm_eager`)."""
    layers: str | None = None
    """A span volunteer's span (`start:end` of the job's layout); None: the coordinator picks."""


JOIN_BACKOFF_S = (1.0, 30.0)
"""The first wait between join tries and the longest: doubled after each failed try."""


async def _join_with_retry(p2p, coordinator: str, request, timeout: float, dht=None):
    """Join, retrying while the coordinator is not up or not reachable, waiting longer after each try
    (`JOIN_BACKOFF_S`) and giving up after `timeout`; between tries, dial the addresses the coordinator
    signs into the job's DHT (`dht`), for when libp2p's routing cannot find it."""
    deadline = time.monotonic() + timeout
    last = ""
    wait, longest = JOIN_BACKOFF_S
    tries = 0
    while time.monotonic() < deadline:
        try:
            return await wire.join(p2p, coordinator, request, timeout=min(30.0, timeout))
        except Exception as exc:  # the coordinator is not up yet, or not reachable yet
            last = f"{type(exc).__name__}: {exc}"
            tries += 1
            left = deadline - time.monotonic()
            pause = min(wait, max(left, 0.0))
            (log.warning if tries == 1 else log.info)(
                "coordinator %s of job %s not reachable (%s); try %d, next in %.0fs, giving up in %.0fs. %s",
                coordinator, request.job, last[:200], tries, pause, max(left, 0.0), JOB_MUST_RUN,
            )  # fmt: skip
            await asyncio.sleep(pause)
            wait = min(wait * 2, longest)
            if dht is not None:
                await _dial_coordinator(dht, p2p, request.job, coordinator)
    raise PeerUnavailable(
        f"could not reach the coordinator {coordinator} of job {request.job!r} in {timeout:g}s after {tries} "
        f"tries ({last[:300]}); {JOB_MUST_RUN}"
    )


async def _dial_coordinator(dht, p2p, job: str, coordinator: str) -> bool:
    """Dial the coordinator at the addresses of its own signed record, when the DHT holds one."""
    try:
        records, _ = await asyncio.wait_for(read_records(dht, job), 10.0)
    except Exception as exc:  # the DHT itself is not reachable yet: the next try reads again
        log.debug("could not read the job's records: %s", exc)
        return False
    for record in records:
        if record.peer_id == coordinator and record.role == "coordinator":
            return await wire.connect(p2p, coordinator, record.maddrs)
    return False


async def run_volunteer(
    options: VolunteerOptions,
    *,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until `stop` (or a signal)."""
    claims = read_claims(options.token)
    if claims.job != options.job:
        raise TokenError(f"the token is for job {claims.job!r}, not {options.job!r}")
    if claims.expires_at < time.time():
        raise TokenError("the token has expired; ask the job's owner for a new one (`dverl token`)")
    if options.role in ("reward", "reference"):
        # A token-checked job's coordinator computes rewards and reference log-probs on the trusted side:
        # a reward is the training signal itself and cannot be verified from its shape.
        raise VolunteerError(
            f"role {options.role!r}: a token-checked job never takes {options.role} results from a "
            "volunteer; reward and reference volunteers serve the open quick start on trusted networks "
            "(`--model PATH` without --token)"
        )
    if options.role not in ("rollout", "actor", "span"):
        raise VolunteerError(f"role {options.role!r}: only rollout and span volunteers can join a job")
    if options.layers and options.role != "span":
        raise VolunteerError(
            f"--layers: only a span volunteer (--role span) serves layers, not {options.role}"
        )
    began = time.perf_counter()
    async with volunteer_session(options) as session:
        p2p = await session.p2p()
        me = session.me
        hardware = hardware_summary()
        role = "span" if options.role == "span" else "rollout"
        request = m.JoinRequest(options.job, options.token, role, hardware, 0.0)
        reply = await _join_with_retry(
            p2p, claims.coordinator, request, options.join_timeout_s, dht=session.dht
        )
        if not reply.accepted:
            # Refused for what this volunteer brought (a bad or expired token, a blocked identity):
            # input a person must fix, as a bad token checked here would be.
            raise VolunteerError(f"the coordinator refused to let this peer join: {reply.reason}")
        session.private_key = admitted_key(options.job, options.token)
        spec = JobSpec.model_validate_json(await wire.fetch_spec(p2p, claims.coordinator, options.job))
        if role == "span":
            key = reply.weights_verify_key or None
            return await serve_for_job(session, claims.coordinator, spec, key, options.layers, stop=stop)
        model_spec = spec.model
        if options.model:
            model_spec = type(spec.model).model_validate({"path": options.model, "dtype": spec.model.dtype})
        model, tokenizer = await asyncio.to_thread(load_model_and_tokenizer, model_spec)
        backend = make_backend(
            spec.roles.rollout.backend_kind,
            model,
            tokenizer,
            eager=options.vllm_eager,
            seed=spec.training.seed,
            version=-1,
        )
        # The key the admitting coordinator gave: weights it did not sign are refused; an unsecured job
        # (no key) publishes unsigned weights.
        if reply.weights_verify_key:
            log.info(
                "weights: only versions signed with the job's key %s are loaded",
                reply.weights_verify_key.hex()[:16],
            )
        source = DeltaP2PWeightSource(
            p2p, claims.coordinator, asyncio.get_running_loop(), verify_key=reply.weights_verify_key or None
        )
        worker = RolloutWorker(
            backend,
            f"volunteer-{me[-8:]}",
            source,
            backend_name=spec.roles.rollout.backend,
            environment=spec.data.environment,
        )
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        endpoint = RolloutEndpoint(
            p2p, worker, coordinator=claims.coordinator, limits=m.WireLimits(vocab_size=vocab)
        )
        await endpoint.register()
        started = time.time()

        def record(expires_at: float) -> VolunteerRecord:
            return VolunteerRecord(
                peer_id=me,
                role="rollout",
                hardware=hardware,
                tokens_per_second=float(worker.tokens_per_second),
                policy_version=int(worker.version),
                expires_at=expires_at,
                started_at=started,
            )

        # Announced before the first weights arrive (version -1: admitted, not yet given work), so a slow
        # link's first full bundle, minutes long, does not cost the peer its admission.
        await session.announce(record)
        held = await asyncio.to_thread(worker.ensure_version, reply.policy_version)
        joined_s = time.perf_counter() - began
        prefetch = WeightPrefetch(source, worker)
        prefetch.start()
        ready = (
            f"volunteer {me} joined job {options.job} as rollout: weights v{held} "
            f"({source.bytes_received} bytes) in {joined_s:.2f}s"
        )
        try:
            return await serve_until_stopped(
                ready,
                served=lambda: (
                    f"volunteer {me} served {endpoint.samples} samples in {endpoint.requests} requests; "
                    f"weights: {source.full_fetches} full ({source.full_bytes} bytes), "
                    f"{source.deltas_used} deltas ({source.delta_bytes} bytes), "
                    f"{source.wait_s_total:.2f}s pulling weights ({prefetch.prefetched} pulls ahead of work)"
                ),
                stop=stop,
            )
        finally:
            await prefetch.stop()


def main_volunteer(options: VolunteerOptions) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_volunteer(options))
