"""The coordinator's span roster without processes: which span a span volunteer gets (the one it names,
in the layout, else the emptiest), who may ask (only a peer admitted with role `span` by the real hub
and its token check), the learner-signed rosters a front accepts, and what a front's reply does (a
dropped volunteer is blocked with its token; an attached one counts as active)."""

from __future__ import annotations

import json

import pytest

from decentralized_verl.errors import WireError
from decentralized_verl.spans.layout import Span
from decentralized_verl.spans.roster import SpanRoster, open_push, pick_span, sign_push
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.tokens import issue_token

SECRET = b"span-roster-secret-0123456789abcdef"
LAYOUT = (Span(0, 2), Span(2, 4), Span(4, 6))


def _hub(roles=("span",), **config) -> VolunteerHub:
    return VolunteerHub(HubConfig(job="job", secret=SECRET, roles=roles, **config), dispatcher=None)


def _join(hub: VolunteerHub, peer: str, role: str = "span") -> m.JoinReply:
    return hub.admit(m.JoinRequest("job", issue_token(SECRET, "job", 600), role, "cpu", 0.0), peer)


def _roster(hub: VolunteerHub) -> SpanRoster:
    return SpanRoster(hub, None, "job", LAYOUT, ("front-a",), b"\x07" * 32)


def test_a_named_span_must_be_in_the_layout_and_otherwise_the_emptiest_is_picked() -> None:
    assert pick_span(LAYOUT, [], None) == Span(0, 2)
    assert pick_span(LAYOUT, [Span(0, 2), Span(4, 6)], None) == Span(2, 4)
    assert pick_span(LAYOUT, [Span(0, 2), Span(2, 4), Span(4, 6), Span(0, 2)], None) == Span(2, 4)
    assert pick_span(LAYOUT, [Span(0, 2)], "0:2") == Span(0, 2)
    with pytest.raises(WireError, match=r"--layers: span 1:3 is not in this job's layout \(0:2, 2:4, 4:6\)"):
        pick_span(LAYOUT, [], "1:3")
    with pytest.raises(Exception, match="--layers"):
        pick_span(LAYOUT, [], "two:four")


def test_only_a_peer_admitted_as_a_span_volunteer_gets_a_span_and_the_fronts() -> None:
    hub = _hub(roles=("rollout", "span"))
    roster = _roster(hub)
    assert roster.assign("stranger", None) == {
        "ok": False,
        "error": "peer stranger has not joined this job as a span volunteer",
    }
    assert _join(hub, "rollout-volunteer", "rollout").accepted
    assert roster.assign("rollout-volunteer", None)["ok"] is False
    assert _join(hub, "v1").accepted and _join(hub, "v2").accepted and _join(hub, "v3").accepted
    assert roster.assign("v1", None) == {"ok": True, "span": "0:2", "fronts": ["front-a"]}
    assert roster.assign("v1", None)["span"] == "0:2"  # the same span each time it asks
    assert roster.assign("v2", "4:6")["span"] == "4:6"
    assert roster.assign("v3", None)["span"] == "2:4"
    refused = roster.assign("v3", "0:3")
    assert refused["ok"] is False and "--layers: span 0:3 is not in this job's layout" in refused["error"]


def test_span_joins_are_refused_with_the_reason_when_the_job_cannot_take_them() -> None:
    assert not _join(_hub(roles=("rollout",)), "p").accepted
    hub = _hub(spans_refused="this job's rollout is not split into spans (roles.rollout.spans)")
    reply = _join(hub, "p")
    assert not reply.accepted and "roles.rollout.spans" in reply.reason


def _keys() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    private = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return private, key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)


def test_a_front_accepts_only_rosters_the_learner_signed() -> None:
    private, public = _keys()
    payload = {"job": "job", "front": "f", "seq": 1.0, "volunteers": [{"peer": "v", "span": "0:2"}]}
    signed = sign_push(payload, private)
    assert open_push(signed, public) == payload
    other, _ = _keys()
    with pytest.raises(WireError, match="not signed by the job's learner"):
        open_push(sign_push(payload, other), public)
    tampered = signed.replace(b'"0:2"', b'"2:4"')
    with pytest.raises(WireError, match="not signed by the job's learner"):
        open_push(tampered, public)
    with pytest.raises(WireError, match="too short"):
        open_push(b"{}", public)


def test_a_front_reporting_a_dropped_volunteer_gets_it_and_its_token_blocked() -> None:
    hub = _hub()
    roster = _roster(hub)
    for peer in ("honest", "cheat"):
        assert _join(hub, peer).accepted
        roster.assign(peer, None)
    roster.take_reply(
        "front-a",
        {
            "attached": {"honest": {"span": "0:2", "hops": 7}, "cheat": {"span": "2:4", "hops": 0}},
            "dropped": {"cheat": "span 2:4: activations off by 0.2"},
        },
    )
    assert "cheat" in hub.blocked and "activations off by 0.2" in hub.blocked["cheat"]
    assert hub.span_serving == {"honest": {"span": "0:2", "hops": 7}}
    assert hub.active() == 1
    assert json.loads(json.dumps(hub.report()))["spans"] == {"honest": {"span": "0:2", "hops": 7}}
    token = hub.peers["cheat"].token
    again = hub.admit(m.JoinRequest("job", "x", "span", "cpu", 0.0), "cheat")
    assert not again.accepted and "blocked" in again.reason
    assert token in hub.blocked_tokens


def test_a_volunteer_a_front_lost_gives_its_slot_back_without_a_block() -> None:
    """Stopped answering is not lying: the hub records a failure (its record is ignored until a fresh one
    comes, and it may serve again), neither the peer nor its token is blocked."""
    hub = _hub()
    roster = _roster(hub)
    assert _join(hub, "gone").accepted
    roster.assign("gone", None)
    roster.take_reply("front-a", {"attached": {"gone": {"span": "0:2", "hops": 3}}})
    assert hub.active() == 1
    roster.take_reply("front-a", {"attached": {}, "dropped": {}, "failed": {"gone": "span 0:2: UNAVAILABLE"}})
    assert hub.active() == 0 and hub.span_serving == {}
    assert "gone" not in hub.blocked and not hub.blocked_tokens
    assert [e.kind for e in hub.events if e.peer_id == "gone"][-1] == "Failed"
    assert hub.is_admitted("gone")


def _job(spans: dict | None) -> dict:
    rollout = {"replicas": 2, "batchSize": 4, **({"spans": spans} if spans else {})}
    return {
        "model": {"tiny": {"numLayers": 4}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "/data/train.jsonl"},
        "roles": {"rollout": rollout},
        "training": {"batchSize": 8},
        "volunteers": {"enabled": True, "roles": ["span"], "tokenSecretRef": {"name": "j-join"}},
    }


def test_span_volunteers_need_a_rollout_split_into_spans():
    from decentralized_verl.errors import ManifestError
    from decentralized_verl.spec.manifest import parse_spec

    with pytest.raises(
        ManifestError, match=r"volunteers.roles: span volunteers serve layers .* roles.rollout.spans"
    ):
        parse_spec(_job(None), "job.yaml")


def test_every_front_of_a_job_taking_span_volunteers_is_told_where_the_dht_is():
    from decentralized_verl.planning.plan import plan_job, worker_env
    from decentralized_verl.spec.manifest import parse_spec

    plan = plan_job(parse_spec(_job({"count": 2}), "job.yaml"), "j")
    addresses = {w.name: f"{w.name}:1" for w in plan.workers}
    for front in plan.by_role("rollout"):
        assert worker_env(plan, front, addresses)["DVERL_DHT_ADDR"] == "j-dht-0:1"
    assert "DVERL_DHT_ADDR" not in worker_env(plan, plan.by_role("span")[0], addresses)


class _Caller:
    """The P2P context a front's Push handler is given: who called."""

    class remote_id:  # hivemind's attribute name
        @staticmethod
        def to_base58() -> str:
            return "caller"


def _front(public: bytes, clock):
    from decentralized_verl.spans.front_volunteers import FrontVolunteers

    return FrontVolunteers(None, None, "job", "f", public, None, clock=clock)


def _push(front, private: bytes, seq: float) -> dict:
    import asyncio
    import json

    from google.protobuf.wrappers_pb2 import BytesValue

    payload = {"job": "job", "front": "f", "seq": seq, "volunteers": []}
    answer = asyncio.run(front._push(BytesValue(value=sign_push(payload, private)), _Caller()))
    return json.loads(answer.value)


def test_a_stolen_key_cannot_lock_a_front_out_of_genuine_rosters() -> None:
    """A roster signed with the learner's key (stolen) and an enormous sequence is refused; one just
    inside the clock bound holds genuine rosters off only until the front's clock passes it."""
    from decentralized_verl.spans.front_volunteers import ROSTER_CLOCK_SKEW_S

    private, public = _keys()
    now = [1_000_000.0]
    front = _front(public, lambda: now[0])
    assert "error" not in _push(front, private, now[0])  # the coordinator's, at its send time
    for enormous in (1e18, float("inf"), float("nan")):
        assert "ahead of this front's clock" in _push(front, private, enormous)["error"]
    now[0] += 1
    assert "error" not in _push(front, private, now[0])  # genuine rosters still accepted
    assert "error" not in _push(front, private, now[0] + ROSTER_CLOCK_SKEW_S - 1)  # the most a thief gets
    now[0] += 5
    assert "a replay" in _push(front, private, now[0])["error"]
    now[0] += ROSTER_CLOCK_SKEW_S
    assert "error" not in _push(front, private, now[0])
    assert "a replay" in _push(front, private, now[0] - 10)["error"]  # an old one is still a replay
