"""Join tokens bound to peers, over real hivemind peers: a coordinator serving Join on libp2p and
volunteers, each its own libp2p identity, trying what a token holder could. A token is redeemed by one
peer id (a second id with it is refused, naming the first), a block follows the token (a blocked
volunteer back under a fresh id is refused), and admitted peers that never announce give their slot
back, so `maxVolunteers` cannot be filled for good.
"""

from __future__ import annotations

import time

import pytest

from decentralized_verl.transport import messages as m
from decentralized_verl.transport.p2p import CoordinatorEndpoints, join
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.tokens import issue_token

pytestmark = pytest.mark.usefixtures("collected_before_fork")

SECRET = b"admission-secret-" * 2
JOB = "admit-job"


@pytest.fixture
def peers():
    """A coordinator peer and three volunteer peers, each with its own libp2p identity."""
    import hivemind

    coordinator = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    maddrs = [str(a) for a in coordinator.get_visible_maddrs()]
    volunteers = [
        hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs) for _ in range(3)
    ]
    yield coordinator, volunteers
    for dht in (*volunteers, coordinator):
        dht.shutdown()


def request(token: str) -> m.JoinRequest:
    return m.JoinRequest(JOB, token, "rollout", "cpu:2 cores", 1.0)


async def test_a_join_token_admits_one_peer_and_a_block_follows_it(peers) -> None:
    coordinator, volunteers = peers
    hub = VolunteerHub(
        HubConfig(job=JOB, secret=SECRET, max_volunteers=1, release_after_s=0.5), dispatcher=None
    )
    server = await coordinator.replicate_p2p()
    endpoints = CoordinatorEndpoints(
        server, admit=hub.admit, is_admitted=hub.is_admitted, publisher=WeightPublisher(), spec_json="{}"
    )
    await endpoints.register()
    own = coordinator.peer_id.to_base58()
    first, second, third = [await v.replicate_p2p() for v in volunteers]
    ids = [v.peer_id.to_base58() for v in volunteers]
    shared = issue_token(SECRET, JOB, 600)

    reply = await join(first, own, request(shared))
    assert reply.accepted and reply.peer_id == ids[0]
    assert (await join(first, own, request(shared))).accepted  # the same peer again: still its token
    reply = await join(second, own, request(shared))
    assert not reply.accepted
    assert (
        reply.reason == f"this join token was redeemed by peer {ids[0]}; each volunteer needs its own token"
    )

    hub.block(ids[0], "sampled responses failed verification")
    reply = await join(first, own, request(shared))
    assert not reply.accepted and "peer is blocked" in reply.reason
    reply = await join(third, own, request(shared))  # back under a fresh identity, same token
    assert not reply.accepted and "this join token is blocked" in reply.reason
    assert f"its holder {ids[0]} was blocked" in reply.reason

    # The one slot: taken by a peer that never announces, then given back.
    assert (await join(second, own, request(issue_token(SECRET, JOB, 600)))).accepted
    reply = await join(third, own, request(issue_token(SECRET, JOB, 600)))
    assert not reply.accepted and "already has 1 volunteers" in reply.reason
    time.sleep(0.6)
    hub.apply_records([])  # a discovery poll: no record from it
    assert ids[1] not in hub.peers and any(e.kind == "Released" and e.peer_id == ids[1] for e in hub.events)
    assert (await join(third, own, request(issue_token(SECRET, JOB, 600)))).accepted


FLOOD = 3000


async def test_a_flood_of_token_less_joins_costs_bounded_log_and_state(peers, caplog, tmp_path) -> None:
    """3,000 Joins without a valid token over libp2p in a few seconds (each a different forged token):
    each refused and counted, but the log, the events and `volunteers.json` hold a bounded number of
    them, and a real volunteer still joins."""
    import asyncio
    import json
    import logging

    coordinator, volunteers = peers
    hub = VolunteerHub(HubConfig(job=JOB, secret=SECRET), dispatcher=None)
    server = await coordinator.replicate_p2p()
    endpoints = CoordinatorEndpoints(
        server, admit=hub.admit, is_admitted=hub.is_admitted, publisher=WeightPublisher(), spec_json="{}"
    )
    await endpoints.register()
    own = coordinator.peer_id.to_base58()
    strangers = [await v.replicate_p2p() for v in volunteers[:2]]
    caplog.set_level(logging.INFO, logger="decentralized_verl.volunteers.discovery")
    for start in range(0, FLOOD, 200):
        batch = range(start, min(start + 200, FLOOD))
        replies = await asyncio.gather(*(join(strangers[i % 2], own, request(f"forged-{i}")) for i in batch))
        assert not any(r.accepted for r in replies)
    assert sum(hub.refused.values()) == FLOOD
    refusals_logged = [r for r in caplog.records if "JoinRefused" in r.getMessage()]
    assert len(refusals_logged) <= hub.config.refusals_per_window + 1, len(refusals_logged)
    assert len(hub.events) <= hub.config.refusals_per_window + 1
    honest = await volunteers[2].replicate_p2p()
    assert (await join(honest, own, request(issue_token(SECRET, JOB, 600)))).accepted
    await hub.close(tmp_path)
    written = (tmp_path / "volunteers.json").read_bytes()
    lines, events = len(refusals_logged), len(hub.events)
    print(
        f"{FLOOD} forged Joins: {lines} log lines, {events} events, {len(written)} bytes of volunteers.json"
    )
    assert len(written) < 20_000, len(written)
    assert sum(json.loads(written)["refused_joins"].values()) == FLOOD
