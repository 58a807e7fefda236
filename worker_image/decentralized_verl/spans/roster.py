"""Span volunteers in a live job: the coordinator assigns each admitted span volunteer a span of the job's
layout and tells it the fronts it may serve; it hands the fronts the volunteers of their spans and blocks
the ones a front caught returning wrong activations.

Who is who, without a new secret:
- a volunteer proves itself to the coordinator with its join token (`discovery.VolunteerHub.admit`), and
  knows the coordinator's peer id from that token;
- a front (a job's rollout worker whose backend is a `SpanBackend`) has a peer id derived from the job's
  TLS key (`peer_identity.front_seed`), which every process of the job holds and no volunteer does, so the
  coordinator knows every front's id in advance and tells volunteers exactly those;
- a front cannot know the coordinator's id (derived from the join secret, which it does not hold), so the
  coordinator's messages to it are signed with the learner's weight-signing key the front already checks
  every weight version with (`sign_push` / `open_push`), each newer than the last, so none can be replayed.

Wire: `BytesValue`s carrying JSON; a front's reply says which volunteers it serves (and how many hops
each served) and which it dropped and why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.wrappers_pb2 import BytesValue

from decentralized_verl.errors import WireError
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.security.peer_identity import front_seed, peer_id_of_seed
from decentralized_verl.security.trust import process_credentials
from decentralized_verl.spans.layout import Span, even_layout, parse_span
from decentralized_verl.transport.p2p import connect, peer
from decentralized_verl.volunteers.announce import VolunteerRecord, front_key

log = logging.getLogger(__name__)

ASSIGN = "dverl.SpanRoster/Assign"
"""Coordinator: an admitted span volunteer asks which span it serves and for whom."""
PUSH = "dverl.SpanFront/Roster"
"""Front: the coordinator's signed list of the span volunteers it should attach."""
DOMAIN = b"dverl-span-roster-v1\x00"


def sign_push(payload: dict[str, Any], signing_key: bytes) -> bytes:
    """The JSON payload followed by the learner's Ed25519 signature over it."""
    body = json.dumps(payload, sort_keys=True).encode()
    return body + Ed25519PrivateKey.from_private_bytes(signing_key).sign(DOMAIN + body)


def open_push(data: bytes, verify_key: bytes) -> dict[str, Any]:
    """The payload of a signed push; `WireError` when the learner's key did not sign it."""
    if len(data) < 64:
        raise WireError("span roster", "too short to carry a signature")
    body, signature = data[:-64], data[-64:]
    try:
        Ed25519PublicKey.from_public_bytes(verify_key).verify(signature, DOMAIN + body)
    except InvalidSignature:
        raise WireError("span roster", "not signed by the job's learner") from None
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise WireError("span roster", "payload is not a mapping")
    return payload


def pick_span(layout: Sequence[Span], taken: Sequence[Span], named: str | None) -> Span:
    """The span a volunteer serves: the one it names (which must be in the layout), else the span with the
    fewest volunteers so far (the first such in layer order)."""
    if named:
        span = parse_span(named, field="--layers")
        if span not in layout:
            raise WireError(
                "--layers", f"span {span} is not in this job's layout ({', '.join(str(s) for s in layout)})"
            )
        return span
    return min(layout, key=lambda s: (sum(1 for t in taken if t == s), s.start))


@dataclass
class SpanRoster:
    """The coordinator's side: assignments, the fronts' ids, and what the fronts last reported."""

    hub: Any
    """The `VolunteerHub`: who is admitted (and as what), who is blocked; it blocks cheaters."""
    p2p: Any
    job: str
    layout: tuple[Span, ...]
    fronts: tuple[str, ...]
    """Peer ids of the job's fronts, rollout worker 0, 1, ... (`peer_identity.front_seed`)."""
    signing_key: bytes
    assigned: dict[str, Span] = field(default_factory=dict)

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(ASSIGN, self._assign, BytesValue)
        self.hub.after_poll.append(self.push)

    def assign(self, caller: str, named: str | None) -> dict[str, Any]:
        """The reply to a span volunteer's Assign; the same span each time it asks."""
        state = self.hub.peers.get(caller)
        if not self.hub.is_admitted(caller) or state is None or state.role != "span":
            return {"ok": False, "error": f"peer {caller} has not joined this job as a span volunteer"}
        try:
            taken = [s for p, s in self.assigned.items() if p != caller and p not in self.hub.blocked]
            span = self.assigned.get(caller) if not named else None
            span = span or pick_span(self.layout, taken, named)
        except WireError as exc:
            return {"ok": False, "error": str(exc)}
        self.assigned[caller] = span
        log.info("span volunteer %s serves layers %s for fronts %s", caller, span, list(self.fronts))
        return {"ok": True, "span": str(span), "fronts": list(self.fronts)}

    async def _assign(self, request: Any, context: Any) -> Any:
        caller = context.remote_id.to_base58()
        try:
            named = json.loads(request.value or b"{}").get("layers")
        except (ValueError, AttributeError):
            return BytesValue(value=json.dumps({"ok": False, "error": "malformed request"}).encode())
        return BytesValue(value=json.dumps(self.assign(caller, named)).encode())

    def volunteers(self, records: Sequence[VolunteerRecord]) -> list[dict[str, Any]]:
        """Live, admitted, unblocked span volunteers with their span and addresses."""
        return [
            {"peer": r.peer_id, "span": str(self.assigned[r.peer_id]), "maddrs": list(r.maddrs)}
            for r in records
            if r.role == "span"
            and r.peer_id in self.assigned
            and self.hub.is_admitted(r.peer_id)
            and r.expires_at > time.time()
        ]

    async def push(self, records: list[VolunteerRecord]) -> None:
        """Give every announced front its volunteers; take in what it attached and whom it dropped."""
        offered = self.volunteers(records)
        for record in records:
            if record.role != "front" or record.peer_id not in self.fronts:
                continue  # a record claiming to be a front that is none of the job's: ignored
            await connect(self.p2p, record.peer_id, record.maddrs)
            payload = {"job": self.job, "front": record.peer_id, "seq": time.time(), "volunteers": offered}
            try:
                reply = await self._call(record.peer_id, sign_push(payload, self.signing_key))
            except Exception as exc:  # a front restarting: the next poll tries again
                log.info("span roster: front %s did not answer (%s)", record.peer_id, exc)
                continue
            self.take_reply(record.peer_id, reply)

    async def _call(self, front: str, data: bytes) -> dict[str, Any]:
        reply = await asyncio.wait_for(
            self.p2p.call_protobuf_handler(peer(front), PUSH, BytesValue(value=data), BytesValue), 30.0
        )
        return json.loads(reply.value)

    def take_reply(self, front: str, reply: dict[str, Any]) -> None:
        for peer_id, reason in dict(reply.get("dropped", {})).items():
            if peer_id in self.hub.peers and peer_id not in self.hub.blocked:
                self.hub.block(str(peer_id), f"front {front[-8:]}: {str(reason)[:300]}")
        for peer_id, reason in dict(reply.get("failed", {})).items():  # stopped answering: not a cheat
            if peer_id in self.hub.peers and peer_id not in self.hub.blocked:
                self.hub.span_serving.pop(str(peer_id), None)
                self.hub.on_failure(str(peer_id), f"front {front[-8:]}: {str(reason)[:300]}", False)
        for peer_id, serving in dict(reply.get("attached", {})).items():
            if peer_id in self.assigned and self.hub.is_admitted(peer_id):
                self.hub.span_serving[str(peer_id)] = {
                    "span": str(serving.get("span", "")),
                    "hops": int(serving.get("hops", 0)),
                }
        self.hub.update_status()


def front_peer_ids(job_key: bytes, job: str, fronts: int) -> tuple[str, ...]:
    return tuple(peer_id_of_seed(front_seed(job_key, job, i)) for i in range(fronts))


async def start_span_roster(spec: Any, job: str, hub: Any, p2p: Any, num_layers: int) -> SpanRoster | None:
    """The roster of a job whose volunteers may serve spans; None (and span joins refused, with the
    reason) when the job's rollout has no spans or the job runs without credentials."""
    if "span" not in spec.volunteers.roles:
        return None
    credentials = process_credentials()
    if spec.roles.rollout.spans is None:
        hub.config.spans_refused = "this job's rollout is not split into spans (roles.rollout.spans)"
        return None
    if credentials is None or not credentials.signing_key:
        hub.config.spans_refused = "this job runs without credentials, so its fronts cannot be told apart"
        return None
    fronts = front_peer_ids(credentials.key, job, len(plan_job(spec, job).by_role("rollout")))
    hub.own_keys.update({front: front_key(job, credentials.key, front) for front in fronts})
    roster = SpanRoster(
        hub,
        p2p,
        job,
        even_layout(num_layers, spec.roles.rollout.spans.count),
        fronts,
        credentials.signing_key,
    )
    await roster.register()
    return roster
