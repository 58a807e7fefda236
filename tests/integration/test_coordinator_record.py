"""A volunteer reaches its coordinator through the address record the coordinator signs into the job's
DHT, not only through libp2p's routing (which may not know a peer that only talked to the bootstrap):
real hivemind peers, each in its own process. A record under another peer's id that claims to be the
coordinator is not dialled."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from decentralized_verl.entrypoints.volunteer import _dial_coordinator
from decentralized_verl.orchestration.volunteering import _announce_coordinator
from decentralized_verl.volunteers.announce import VolunteerRecord, store_record
from decentralized_verl.volunteers.dht import PeerOptions, start_dht

pytestmark = pytest.mark.usefixtures("collected_before_fork")
JOB = "coord-record"
LOCAL = ("/ip4/127.0.0.1/tcp/0",)


async def _scenario() -> tuple[bool, bool, bool]:
    boot = await asyncio.to_thread(start_dht, PeerOptions(host_maddrs=LOCAL, signed_job=JOB))
    peers = [boot]
    try:
        initial = tuple(str(a) for a in boot.get_visible_maddrs())
        options = PeerOptions(initial_peers=initial, host_maddrs=LOCAL, signed_job=JOB)
        coordinator, volunteer, impostor = [await asyncio.to_thread(start_dht, options) for _ in range(3)]
        peers += [coordinator, volunteer, impostor]
        target = coordinator.peer_id.to_base58()
        p2p = await volunteer.replicate_p2p()
        # Before the coordinator announces itself, an impostor's record saying "coordinator" is ignored:
        # it is signed by the impostor, so it stands under the impostor's id, not the coordinator's.
        fake = VolunteerRecord(
            impostor.peer_id.to_base58(), "coordinator", "", 0.0, 0, 9e9, maddrs=("/ip4/127.0.0.1/tcp/9",)
        )
        assert await store_record(impostor, JOB, fake)
        before = await _dial_coordinator(volunteer, p2p, JOB, target)
        heartbeat = await _announce_coordinator(coordinator, JOB, SimpleNamespace(volunteer_poll_s=0.5))
        try:
            dialled = await _dial_coordinator(volunteer, p2p, JOB, target)
            connected = target in {str(info.peer_id) for info in await p2p.list_peers()}
        finally:
            await heartbeat.stop()
        return before, dialled, connected
    finally:
        for peer in peers:
            peer.shutdown()


def test_a_volunteer_dials_the_coordinator_at_its_signed_address_record() -> None:
    before, dialled, connected = asyncio.run(_scenario())
    assert before is False  # nothing signed by the coordinator yet: nothing to dial
    assert dialled is True
    assert connected
