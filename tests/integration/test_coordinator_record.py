"""A volunteer reaches its coordinator through the address record the coordinator signs into the job's
DHT, not only through libp2p's routing (which may not know a peer that only talked to the bootstrap):
real hivemind peers, each in its own process. A record under another peer's id that claims to be the
coordinator is not dialled. The record's heartbeat stops when told, even when the stop lands just as a
store completes (a busy machine makes that likely); a peer whose process dies or hangs before it serves
is reported, not waited for forever."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest

from decentralized_verl.entrypoints.volunteer import _dial_coordinator
from decentralized_verl.errors import PeerUnavailable
from decentralized_verl.orchestration.volunteering import _announce_coordinator
from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord, store_record
from decentralized_verl.volunteers.dht import PeerOptions, _started, start_dht

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


class HeldStores:
    """The DHT side of a heartbeat, whose stores complete when the test says so."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future] = []

    def store(self, key, value, expiration_time, subkey=None, return_future=True) -> asyncio.Future:
        self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[-1]


async def _stop_as_a_store_completes() -> tuple[bool, int]:
    dht = HeldStores()
    heartbeat = Heartbeat(
        dht,
        JOB,
        lambda expires: VolunteerRecord("me", "coordinator", "", 0.0, 0, expires),
        interval=60,
        ttl=120,
    )
    heartbeat.start()
    while not dht.pending:
        await asyncio.sleep(0)
    # The store's answer and the stop arrive in the same turn of the event loop: a stop whose cancellation
    # was dropped there would leave the heartbeat beating, and wait for it forever.
    dht.pending[0].set_result(True)
    async with asyncio.timeout(60) as guard:  # only ends a stop that would wait forever
        await heartbeat.stop()
    assert heartbeat._task is not None
    return not guard.expired() and heartbeat._task.done(), len(dht.pending)


def test_a_heartbeat_stopped_as_its_store_completes_stops() -> None:
    stopped_by_itself, stores = asyncio.run(_stop_as_a_store_completes())
    assert stopped_by_itself and stores == 1  # and it did not beat again


def test_a_dht_peer_whose_process_dies_or_hangs_before_serving_is_reported() -> None:
    import hivemind

    class DiesAtStart(hivemind.DHT):
        def run(self) -> None:
            os._exit(3)

    class HangsAtStart(hivemind.DHT):
        def run(self) -> None:
            time.sleep(3600)

    with pytest.raises(PeerUnavailable, match="the DHT peer's process exited with code 3 before it served"):
        _started(DiesAtStart(start=False), ready_timeout_s=600)
    hung = HangsAtStart(start=False)
    with pytest.raises(PeerUnavailable, match="did not serve within 2s; ended it"):
        _started(hung, ready_timeout_s=2)
    hung.join(30)
    assert not hung.is_alive()
