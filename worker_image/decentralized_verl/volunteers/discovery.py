"""Coordinator side: admit volunteers by token, find them in the DHT, hand them to the Dispatcher.

The hub runs in the learner process next to the training loop:
- `admit` (the P2P Join handler) verifies the join token for this job and remembers the caller's
  authenticated peer id; a blocked peer, a wrong role or a full job is refused with a reason. A token
  is redeemed by one peer identity: the same token from another peer id is refused, and a block
  follows the token, so a blocked volunteer cannot come back under a fresh id with it.
- an admitted peer with no live record for `release_after_s` (it never announced, or stopped) gives
  its slot back, so peers that join and go quiet cannot fill `maxVolunteers` for good.
- every `poll_s` it reads, for each admitted peer, the key only that peer and the coordinator can name
  (`announce.admitted_key`; an open job reads the job's whole key): an admitted, unblocked peer with a
  live record becomes a `VolunteerRolloutClient` in the dispatcher; a record that lapsed (the volunteer
  vanished) removes it. A peer whose stream failed is left out until it heartbeats again.
- a peer caught by verification is blocked for the job: removed, refused on re-join, logged as an event.
- its admission state (each redeemed token's peer and history, blocked peers and tokens: `admission.py`)
  is written to the run folder whenever it changes and taken up again by a resumed learner: a learner
  restart forgets no block and no redemption.
- refusals cost bounded log and state whatever their rate (a flood of token-less Joins): at most
  `refusals_per_window` are logged and kept as events each window, the rest only counted; the events
  kept are the latest `MAX_EVENTS`, so `volunteers.json` stays bounded too.
The number of active volunteers is written to `JobStatus.volunteers` (Status RPC -> `.status`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl.planning.devices import GPU_PRIORS
from decentralized_verl.runtime.lifecycle import cancel_and_wait
from decentralized_verl.security.trust import weights_verify_key
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.p2p import connect
from decentralized_verl.volunteers.admission import AdmissionLedger
from decentralized_verl.volunteers.announce import VolunteerRecord, admitted_key, read_admitted, read_records
from decentralized_verl.volunteers.client import VolunteerRolloutClient
from decentralized_verl.volunteers.tokens import TokenError, verify_token

log = logging.getLogger(__name__)

MAX_EVENTS = 1000
"""Volunteer events kept (the latest): what the report and `volunteers.json` hold."""

SUPPORTED_ROLES = ("rollout", "actor", "span")
"""Roles a volunteer can serve to this coordinator today (`actor` is the quick start's name for rollout;
`span` volunteers serve layers to the job's fronts, `spans.roster`)."""


def hardware_prior(hardware: str) -> float:
    """The dispatcher's starting weight from an announced GPU name (measured throughput replaces it)."""
    text = hardware.lower().replace(" ", "")
    for name, prior in sorted(GPU_PRIORS.items(), key=lambda kv: -len(kv[0])):
        if name in text:
            return prior
    return 1.0


@dataclass
class PeerState:
    admitted_at: float
    role: str
    failed_record_expiry: float = 0.0
    """Expiry of the record seen when its stream failed: only a newer heartbeat re-adds the peer."""
    samples_accepted: int = 0
    samples_rejected: int = 0
    last_seen: float = 0.0
    """When it joined or last had a live record: a slot quiet longer than `release_after_s` is freed."""
    token: str = ""
    """The nonce of the join token it redeemed (a block follows the token)."""


@dataclass
class VolunteerEvent:
    time: float
    kind: str  # Joined, JoinRefused, Added, Removed, Failed, Blocked
    peer_id: str
    reason: str = ""


@dataclass
class HubConfig:
    job: str
    secret: bytes
    roles: tuple[str, ...] = ("rollout",)
    max_volunteers: int = 64
    poll_s: float = 2.0
    deadline_s: float = 300.0
    limits: m.WireLimits = field(default_factory=m.WireLimits)
    answer_keeps_s: float = 30.0
    """A volunteer that answered work this recently stays even if its record lapsed: heartbeats can fail
    to land while a DHT peer is partitioned, and a record is only a claim where an answer is evidence."""
    release_after_s: float = 60.0
    """An admitted peer with no live record for this long gives its slot back (it may join again)."""
    spans_refused: str = ""
    """Why span volunteers cannot join this job although `volunteers.roles` names them ("" when they can)."""
    refusals_per_window: int = 20
    refusal_window_s: float = 60.0
    """At most this many refused Joins are logged and kept as events per window; the rest are counted."""
    open: bool = False
    """The quick-start job (open_worker.py): every announced actor is used without a token; trusted
    networks only. Verification and blocking still apply."""


class VolunteerHub:
    def __init__(
        self,
        config: HubConfig,
        dispatcher,
        *,
        p2p=None,
        dht=None,
        publisher=None,
        verifier=None,
        status=None,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.p2p = p2p
        self.dht = dht
        self.publisher = publisher
        self.verifier = verifier
        self.status = status
        """The coordinator's StatusBoard: volunteers and blocked peers reach `.status` through it."""
        self.peers: dict[str, PeerState] = {}
        self.admission = AdmissionLedger(config.job)
        """Redeemed and blocked tokens, blocked peers: what a resumed learner takes up."""
        self.record_keys: dict[str, str] = {}
        """Admitted peer id -> the key its record is kept under (`announce.admitted_key` of its token)."""
        self.own_keys: dict[str, str] = {}
        """The job's own peers the hub reads too (span fronts, `announce.front_key`): peer id -> key."""
        self.clients: dict[str, Any] = {}
        self.events: deque[VolunteerEvent] = deque(maxlen=MAX_EVENTS)
        self.refused: Counter[str] = Counter()
        """Refused Joins by reason (up to the first colon; 32 kinds, then "other": a caller names what
        some reasons quote), every one counted where the events keep only some."""
        self._refusal_window = (0.0, 0, 0)
        """(window start, refusals kept in it, refusals not kept in it)."""
        self._all_clients: dict[str, Any] = {}
        self._last_expiry: dict[str, float] = {}
        self._seen: dict[str, VolunteerRecord] = {}
        self._task: asyncio.Task | None = None
        self._closers: list[Callable[[], Any]] = []
        self.span_serving: dict[str, dict[str, Any]] = {}
        """Span volunteers a front attached: peer id -> {"span", "hops"} as the front last reported."""
        self.after_poll: list[Callable[[list[VolunteerRecord]], Awaitable[None]]] = []
        """Called with every poll's live records (the span roster hands span volunteers to fronts)."""

    # ------------------------------------------------------------------------------------ trust
    def _event(self, kind: str, peer_id: str, reason: str = "") -> None:
        self.events.append(VolunteerEvent(time.time(), kind, peer_id, reason))
        level = logging.WARNING if kind in ("Blocked", "JoinRefused", "Failed") else logging.INFO
        log.log(level, "volunteer event %s: peer %s %s", kind, peer_id, reason)

    def _refused(self, caller: str, reason: str) -> None:
        """A refused Join: counted always; logged and kept as an event only `refusals_per_window` times a
        window, and once per window a line saying how many were not."""
        kind = reason.split(":")[0][:60]
        self.refused[kind if kind in self.refused or len(self.refused) < 32 else "other"] += 1
        now = time.monotonic()
        start, kept, dropped = self._refusal_window
        if now - start > self.config.refusal_window_s:
            if dropped:
                self._event("JoinRefused", "", f"{dropped} more refused Joins not recorded")
            start, kept, dropped = now, 0, 0
        if kept < self.config.refusals_per_window:
            self._event("JoinRefused", caller, reason)
            kept += 1
        else:
            dropped += 1
        self._refusal_window = (start, kept, dropped)

    def admit(self, request: m.JoinRequest, caller: str) -> m.JoinReply:
        def refuse(reason: str) -> m.JoinReply:
            self._refused(caller, reason)
            return m.JoinReply(False, reason=reason)

        if caller in self.blocked:
            return refuse(f"peer is blocked for job {self.config.job}: {self.blocked[caller]}")
        try:
            claims = verify_token(self.config.secret, request.token, self.config.job)
        except TokenError as exc:
            return refuse(exc.reason)
        if claims.nonce in self.blocked_tokens:
            return refuse(
                f"this join token is blocked for job {self.config.job}: {self.blocked_tokens[claims.nonce]}"
            )
        holder = self.admission.holder(claims.nonce)
        if holder is not None and holder != caller:
            return refuse(
                f"this join token was redeemed by peer {holder}; each volunteer needs its own token"
            )
        if request.job != self.config.job:
            return refuse(f"this coordinator runs job {self.config.job!r}, not {request.job!r}")
        role = "rollout" if request.role == "actor" else request.role
        if role == "span" and self.config.spans_refused:
            return refuse(f"role 'span': {self.config.spans_refused}")
        if role not in self.config.roles or role not in SUPPORTED_ROLES:
            return refuse(
                f"role {request.role!r} is not open to volunteers here (open: {list(self.config.roles)})"
            )
        active = sum(1 for p in self.peers if p not in self.blocked)
        if caller not in self.peers and active >= self.config.max_volunteers:
            return refuse(f"the job already has {active} volunteers (maxVolunteers)")
        now = time.time()
        state = self.peers.setdefault(caller, PeerState(now, role, token=claims.nonce))
        state.last_seen = now
        self.record_keys[caller] = admitted_key(self.config.job, request.token)
        self.admission.redeem(claims.nonce, caller, now)
        self._event("Joined", caller, f"role={role} hardware={request.hardware!r}")
        version = self.publisher.latest_version if self.publisher is not None else 0
        own = self.p2p.peer_id.to_base58() if self.p2p is not None else "coordinator"
        return m.JoinReply(
            True,
            peer_id=caller,
            policy_version=version or 0,
            weights_address=own,
            weights_verify_key=weights_verify_key() or b"",
        )

    def is_admitted(self, peer_id: str) -> bool:
        if self.config.open:
            return peer_id not in self.blocked
        return peer_id in self.peers and peer_id not in self.blocked

    def on_failure(self, peer_id: str, reason: str, dishonest: bool) -> None:
        if dishonest:
            self.block(peer_id, reason)
            return
        self._event("Failed", peer_id, reason)
        client = self.clients.pop(peer_id, None)
        if client is not None:
            self.dispatcher.remove(client.worker_id)
        state = self.peers.get(peer_id)
        if state is not None:
            state.failed_record_expiry = self._last_expiry.get(peer_id, time.time())
        self.update_status()

    def block(self, peer_id: str, reason: str) -> None:
        state = self.peers.get(peer_id)
        if not self.admission.block(peer_id, state.token if state is not None else "", reason):
            return
        if self.status is not None:
            self.status.block(peer_id, reason)  # the operator's counter and Event
        self._event("Blocked", peer_id, reason)
        client = self.clients.pop(peer_id, None)
        if client is not None:
            self.dispatcher.remove(client.worker_id)
        self.span_serving.pop(peer_id, None)
        self.update_status()

    # ------------------------------------------------------------------------------- admission state
    @property
    def blocked(self) -> dict[str, str]:
        return self.admission.blocked

    @property
    def blocked_tokens(self) -> dict[str, str]:
        return self.admission.blocked_tokens

    @property
    def token_history(self) -> dict[str, dict[str, Any]]:
        return self.admission.token_history

    def keep_admission(self, path: Path, *, restore: bool) -> None:
        """Keep the admission state in `path` (AdmissionLedger.keep); the blocks taken up are the
        operator's to count again."""
        self.admission.keep(path, restore=restore)
        if self.status is not None:
            for peer_id, reason in self.blocked.items():
                self.status.block(peer_id, reason)

    # ------------------------------------------------------------------------------- discovery
    def make_client(self, record: VolunteerRecord):
        return VolunteerRolloutClient(
            self.p2p,
            record.peer_id,
            limits=self.config.limits,
            deadline_s=self.config.deadline_s,
            verifier=self.verifier,
            on_failure=self.on_failure,
        )

    def remembered(self, records: list[VolunteerRecord], now: float) -> list[VolunteerRecord]:
        """This read's records plus those seen before that have not lapsed yet: a DHT read that misses a
        record (a partitioned peer held it, a lookup timed out on a slow link) is not the volunteer leaving;
        only its record's expiry is."""
        for record in records:
            seen = self._seen.get(record.peer_id)
            if seen is None or record.expires_at >= seen.expires_at:
                self._seen[record.peer_id] = record
        self._seen = {p: r for p, r in self._seen.items() if r.expires_at > now}
        return list(self._seen.values())

    def apply_records(self, records: list[VolunteerRecord], now: float | None = None) -> None:
        """Pure-ish core of a poll: reconcile dispatcher clients with live, admitted records."""
        now = time.time() if now is None else now
        records = self.remembered(records, now)
        self._last_expiry = {r.peer_id: r.expires_at for r in records}
        live = {
            r.peer_id: r
            for r in records
            if self.is_admitted(r.peer_id) and ("rollout" if r.role == "actor" else r.role) == "rollout"
        }
        for record in records:  # a span volunteer keeps its slot while its record lives
            state = self.peers.get(record.peer_id)
            if record.role == "span" and state is not None and self.is_admitted(record.peer_id):
                state.last_seen = now
        for peer_id, record in live.items():
            state = self.peers.setdefault(peer_id, PeerState(now, "rollout"))
            state.last_seen = now
            if record.policy_version < 0 and not self.config.open:
                # A joined volunteer still pulling its first weights: alive, not yet given work. (An open
                # job's actors pull on their first request, so they are given work at once.)
                continue
            if peer_id in self.clients or record.expires_at <= state.failed_record_expiry:
                continue
            client = self.make_client(record)
            self.clients[peer_id] = client
            self._all_clients[peer_id] = client
            self.dispatcher.add(client, prior=hardware_prior(record.hardware))
            self._event("Added", peer_id, f"{record.hardware}, {record.tokens_per_second:.1f} tok/s")
        for peer_id in [p for p in self.clients if p not in live]:
            if now - getattr(self.clients[peer_id], "last_answer", 0.0) < self.config.answer_keeps_s:
                continue  # it answered work just now: alive, whatever the DHT could or could not confirm
            client = self.clients.pop(peer_id)
            self.dispatcher.remove(client.worker_id)
            self._event("Removed", peer_id, "record expired")
        self.release_quiet(now)
        self.update_status()

    def release_quiet(self, now: float) -> list[str]:
        """Free the slots of admitted peers with no live record for `release_after_s`; the peer may join
        again (with its own token), but until then it counts against no limit."""
        quiet = [
            peer_id
            for peer_id, state in self.peers.items()
            if peer_id not in self.blocked
            and peer_id not in self.clients
            and now - max(state.last_seen, state.admitted_at) > self.config.release_after_s
        ]
        for peer_id in quiet:
            del self.peers[peer_id]
            self._event("Released", peer_id, f"no live record for {self.config.release_after_s:.0f}s")
        return quiet

    def update_status(self) -> None:
        if self.status is not None:
            self.status.update(volunteers=self.active())

    def active(self) -> int:
        """Volunteers doing work: rollout clients in dispatch and span volunteers a front attached."""
        return len(self.clients) + len(self.span_serving)

    def live_records(self, role: str) -> list[VolunteerRecord]:
        """Unexpired records of `role` seen by recent polls (any peer: the caller judges who it trusts)."""
        now = time.time()
        return [r for r in self._seen.values() if r.role == role and r.expires_at > now]

    async def poll_once(self) -> None:
        # Records lapse against the time this read began: a read that hangs while a partitioned DHT peer
        # times out must not expire every record whose heartbeat it was blind to.
        began = time.time()
        try:
            async with asyncio.timeout(max(5.0, 4 * self.config.poll_s)):  # a close's cancel is never dropped
                records, problems = await self._read()
        except TimeoutError:
            log.info(
                "volunteer discovery: a DHT read timed out (a peer is unreachable); keeping what is known"
            )
            return
        for problem in problems:
            log.debug("ignoring DHT record: %s", problem)
        for record in records:
            if (
                record.peer_id not in self.clients
                and self.is_admitted(record.peer_id)
                and self.p2p is not None
            ):
                await connect(self.p2p, record.peer_id, record.maddrs)
        self.apply_records(records, now=began)
        for hook in self.after_poll:
            await hook(list(self._seen.values()))

    async def _read(self) -> tuple[list[VolunteerRecord], list[str]]:
        """An open job reads the job's key (its actors announce without joining); a token-checked one
        only the keys of the peers it admitted, so what strangers write there costs it nothing."""
        if self.config.open:
            return await read_records(self.dht, self.config.job)
        keys = {p: k for p, k in self.record_keys.items() if p in self.peers and p not in self.blocked}
        return await read_admitted(self.dht, {**keys, **self.own_keys})

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:
                log.exception("volunteer discovery poll failed")
            await asyncio.sleep(self.config.poll_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="volunteer-discovery")

    async def wait_for(self, count: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.active() < count and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return self.active()

    def wrap_publish(self, publish: Callable[[int], None], model) -> Callable[[int], None]:
        """Make sure every version also reaches the publisher volunteers pull from."""

        def wrapped(version: int) -> None:
            publish(version)
            if self.publisher.latest_version != version:
                self.publisher.publish(rollout_state_dict(model), version)

        return wrapped

    def report(self) -> dict[str, Any]:
        return {
            "active": sorted(self.clients),
            "admitted": sorted(self.peers),
            "blocked": dict(self.blocked),
            "samples": {
                pid: {"accepted": c.accepted, "rejected": c.rejected} for pid, c in self._all_clients.items()
            },
            "spans": {pid: dict(serving) for pid, serving in self.span_serving.items()},
            "verified_samples": getattr(self.verifier, "checked", 0),
            "rejected_batches": getattr(self.verifier, "rejected_batches", 0),
            "events": [vars(e) for e in self.events],
            "refused_joins": dict(self.refused),
        }

    async def close(self, output: Path | None = None) -> None:
        await cancel_and_wait(self._task)
        for hook in self.after_poll:  # a last word with the fronts, so the report holds what they saw
            try:
                await asyncio.wait_for(hook(list(self._seen.values())), 30.0)
            except Exception as exc:
                log.info("volunteer hub: the last exchange before closing failed (%s)", exc)
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
            (output / "volunteers.json").write_text(json.dumps(self.report(), indent=2) + "\n")
        for close in self._closers:
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("closing volunteer transport")
