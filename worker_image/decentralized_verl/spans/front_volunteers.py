"""A front taking span volunteers: it joins the job's DHT under its front identity, announces itself, and
attaches each span volunteer the coordinator hands it (`spans.roster`) as an untrusted replica
of its span.

A volunteer is attached between micro-batches (under the backend's lock), after it holds the chain's
weights (brought up to date with the signed manifest of its span when it holds another version), and
takes its span's hops from then on; the chain spot-checks a fraction of them on the trusted replica and
drops it on a mismatch (`chain.ChainSession._spot_check`). The front's answer to the coordinator's next
roster reports the drop, and the coordinator blocks the volunteer. A volunteer that stops answering is
dropped too (`Chain.replace`) and reported as failed, which frees its slot without a block; it is
attached again if the coordinator offers it once more. Nothing is lost either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.wrappers_pb2 import BytesValue

from decentralized_verl.errors import DverlError
from decentralized_verl.security.peer_identity import bootstrap_maddr, front_seed
from decentralized_verl.security.trust import process_credentials
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.layout import parse_span
from decentralized_verl.spans.p2p import P2PSpanClient
from decentralized_verl.spans.roster import PUSH, open_push
from decentralized_verl.transport.p2p import connect, listen_maddrs
from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord, front_key, hardware_summary
from decentralized_verl.volunteers.dht import PeerOptions, start_dht

log = logging.getLogger(__name__)

ROSTER_CLOCK_SKEW_S = 120.0
"""How far ahead of this front's clock a roster's sequence (the coordinator's send time) may be. A roster
signed with a stolen key and an enormous sequence would otherwise make every genuine roster after it look
like a replay for the rest of the run; bounded by the clock, it can hold them off this long at most."""


@dataclass
class FrontVolunteers:
    backend: SpanBackend
    p2p: Any
    job: str
    me: str
    verify_key: bytes
    loop: asyncio.AbstractEventLoop
    timeout_s: float = 60.0
    clock: Any = time.time
    attached: dict[str, P2PSpanClient] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    """Volunteers that stopped answering, not yet reported to the coordinator."""
    _last_seq: float = 0.0
    _pending: set[str] = field(default_factory=set)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(PUSH, self._push, BytesValue)
        self.backend.chain.on_drop = self._on_drop
        self.backend.chain.on_lost = self._on_lost

    def _on_drop(self, client: Any, reason: str) -> None:
        peer_id = getattr(client, "peer_id", None)
        if peer_id is not None:
            self.dropped[peer_id] = reason
            self.attached.pop(peer_id, None)
            log.warning("span volunteer %s dropped: %s", peer_id, reason)

    def _on_lost(self, client: Any, reason: str) -> None:
        peer_id = getattr(client, "peer_id", None)
        if peer_id is not None:
            self.lost[peer_id] = reason
            self.attached.pop(peer_id, None)

    def reply(self) -> dict[str, Any]:
        lost = dict(self.lost)  # copied first: a drop or a loss is recorded from the generating thread
        for peer_id in lost:
            self.lost.pop(peer_id, None)  # reported once; a volunteer that comes back is attached again
        return {
            "attached": {
                p: {"span": str(self._span_of(c)), "hops": c.hops_served}
                for p, c in list(self.attached.items())
            },
            "dropped": dict(self.dropped),
            "failed": lost,
        }

    def _span_of(self, client: Any) -> Any:
        for route in self.backend.chain.routes:
            if client in route.clients:
                return route.span
        return ""

    async def _push(self, request: Any, context: Any) -> Any:
        try:
            payload = open_push(request.value, self.verify_key)
            seq = float(payload["seq"])
            if payload.get("job") != self.job or payload.get("front") != self.me:
                raise DverlError("span roster: addressed to another job or front")
            if seq <= self._last_seq:
                raise DverlError("span roster: not newer than the last one (a replay)")
            if not seq <= self.clock() + ROSTER_CLOCK_SKEW_S:  # NaN and infinity too
                raise DverlError(
                    f"span roster: sequence {seq} is more than {ROSTER_CLOCK_SKEW_S:g} s ahead of this "
                    "front's clock (a sequence no coordinator sends)"
                )
            self._last_seq = seq
            offered = list(payload.get("volunteers", []))
        except (DverlError, KeyError, TypeError, ValueError) as exc:
            log.warning("refused a span roster from %s: %s", context.remote_id.to_base58(), exc)
            return BytesValue(value=json.dumps({"error": str(exc)}).encode())
        for volunteer in offered:
            peer_id = str(volunteer.get("peer", ""))
            if not peer_id or peer_id in self.attached or peer_id in self.dropped or peer_id in self._pending:
                continue
            self._pending.add(peer_id)
            self._tasks.add(
                asyncio.create_task(
                    self._attach(peer_id, str(volunteer.get("span")), volunteer.get("maddrs", []))
                )
            )
        return BytesValue(value=json.dumps(self.reply()).encode())

    async def _attach(self, peer_id: str, span_text: str, maddrs: list[str]) -> None:
        try:
            await connect(self.p2p, peer_id, [str(a) for a in maddrs])
            client = P2PSpanClient(self.p2p, peer_id, self.loop, timeout_s=self.timeout_s)
            index = [str(r.span) for r in self.backend.chain.routes].index(str(parse_span(span_text)))
            if await asyncio.to_thread(self.backend.attach, index, client):
                self.attached[peer_id] = client
                log.info("span volunteer %s attached to span %s", peer_id, span_text)
        except (DverlError, ValueError) as exc:
            log.warning("span volunteer %s not attached yet: %s", peer_id, exc)
        finally:
            self._pending.discard(peer_id)
            self._tasks = {t for t in self._tasks if not t.done()}


async def start_front_volunteers(
    backend: SpanBackend, job: str, index: int, dht_addr: str, settings: Any
) -> tuple[FrontVolunteers, Any] | None:
    """Join the job's DHT as front `index` and take span volunteers; None for a job without credentials
    (the coordinator refuses span volunteers then, saying why)."""
    credentials = process_credentials()
    if credentials is None or not credentials.verify_key:
        log.warning("span volunteers: this front holds no job credentials, so it takes none")
        return None
    host = settings.bind_host or "127.0.0.1"
    options = PeerOptions(
        initial_peers=(bootstrap_maddr(dht_addr, credentials.dht_peer),),
        host_maddrs=(f"/ip4/{host}/tcp/0",),
        announce_maddrs=settings.p2p_announce,
        identity_seed=front_seed(credentials.key, job, index),
        signed_job=job,
    )
    dht = await asyncio.to_thread(start_dht, options)
    p2p = await dht.replicate_p2p()
    me = dht.peer_id.to_base58()
    front = FrontVolunteers(backend, p2p, job, me, credentials.verify_key, asyncio.get_running_loop())
    await front.register()
    hardware, maddrs = hardware_summary(), listen_maddrs(dht)

    def record(expires_at: float) -> VolunteerRecord:
        return VolunteerRecord(me, "front", hardware, 0.0, backend.version, expires_at, maddrs=maddrs)

    interval = settings.volunteer_poll_s * 2 + 1.0
    private_key = front_key(
        job, credentials.key, me
    )  # the coordinator reads it there, whatever floods the job's key
    heartbeat = Heartbeat(dht, job, record, interval=interval, ttl=30.0, private_key=private_key)
    await heartbeat.beat()
    heartbeat.start()
    log.info("front %d takes span volunteers as peer %s", index, me)

    async def close() -> None:
        await heartbeat.stop()
        dht.shutdown()

    return front, close
