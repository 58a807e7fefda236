"""The job's DHT under a flood: a stranger's process stores 3,000 volunteer records under the job's key,
each validly self-signed by a fresh identity (what the job's peers accept: a record signed by the peer
it names). The bootstrap, the coordinator's hub and an honest volunteer are real hivemind peers, each in
its own process. The coordinator reads only the keys of the peers it admitted, so every one of its polls
sees the honest volunteer, while a read of the job's whole key has to take in the flood.

Run as a script (`python tests/integration/test_dht_flood_live.py flood MADDR JOB N`) this file is the
stranger: it prints `flooded N` once its peer has stored them, and stays until its stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from decentralized_verl.transport import messages as m
from decentralized_verl.transport.p2p import CoordinatorEndpoints, join
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
from decentralized_verl.volunteers.tokens import issue_token
from tests.support.processes import console_env, script_argv

pytestmark = pytest.mark.usefixtures("collected_before_fork")

SECRET = b"flood-secret-0123456789-flood-secret"
JOB = "flood-job"
FLOOD = int(os.environ.get("DHT_FLOOD_RECORDS", "1000"))
"""1,000 in the suite; BENCHMARKS.md's row runs 3,000 (`DHT_FLOOD_RECORDS=3000`)."""


def _flood(maddr: str, job: str, count: int) -> None:
    """A stranger's peer (no validator of its own, so it keeps what it is told) storing `count` records,
    each signed by a fresh identity as the job's peers require."""
    import hivemind
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord, RecordValidatorBase

    from decentralized_verl.security.peer_identity import keypair, peer_id_of_public, random_seed
    from decentralized_verl.volunteers.announce import VolunteerRecord, job_key
    from decentralized_verl.volunteers.signed_records import MARK, signed_bytes

    keys = {}
    for _ in range(count):
        private, public = keypair(random_seed())
        keys[peer_id_of_public(public)] = private

    class SignsForEveryone(RecordValidatorBase):
        key_id = DHTID.generate(source=job_key(job)).to_bytes()

        def validate(self, record: DHTRecord) -> bool:
            return True

        def sign_value(self, record: DHTRecord) -> bytes:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            owner = DHTProtocol.serializer.loads(record.subkey)
            key = Ed25519PrivateKey.from_private_bytes(keys[owner])
            return record.value + MARK + key.sign(signed_bytes(record, record.value))

        def strip_value(self, record: DHTRecord) -> bytes:
            return record.value

    dht = hivemind.DHT(
        start=True,
        initial_peers=[maddr],
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        record_validators=[SignsForEveryone()],
    )
    expires = time.time() + 600
    futures = [
        dht.store(
            job_key(job),
            VolunteerRecord(peer, "rollout", "cuda:H100 x8", 1e6, 0, expires).to_value(),
            expires,
            subkey=peer,
            return_future=True,
        )
        for peer in keys
    ]
    stored = sum(bool(f.result()) for f in futures)
    print(f"flooded {stored}", flush=True)
    sys.stdin.read()
    dht.shutdown()


async def test_a_flood_of_self_signed_records_hides_no_honest_volunteer() -> None:
    from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord, admitted_key, read_records
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    host = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap = start_dht(PeerOptions(host_maddrs=host, signed_job=JOB))
    maddr = str(bootstrap.get_visible_maddrs()[0])
    stranger = subprocess.Popen(
        script_argv(__file__, "flood", maddr, JOB, str(FLOOD)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=console_env(),
        text=True,
    )
    from decentralized_verl.security.peer_identity import coordinator_seed

    coordinator = start_dht(
        PeerOptions(
            initial_peers=(maddr,),
            host_maddrs=host,
            signed_job=JOB,
            identity_seed=coordinator_seed(SECRET, JOB),
        )
    )
    volunteer = start_dht(PeerOptions(initial_peers=(maddr,), host_maddrs=host, signed_job=JOB))
    try:
        line = await asyncio.to_thread(stranger.stdout.readline)
        assert line.startswith("flooded "), line
        assert int(line.split()[1]) > FLOOD // 2  # most of the flood is in the DHT

        hub = VolunteerHub(HubConfig(job=JOB, secret=SECRET, poll_s=0.5), dispatcher=None)
        server = await coordinator.replicate_p2p()
        hub.p2p, hub.dht = server, coordinator
        endpoints = CoordinatorEndpoints(
            server, admit=hub.admit, is_admitted=hub.is_admitted, publisher=WeightPublisher(), spec_json="{}"
        )
        await endpoints.register()
        token = issue_token(SECRET, JOB, 600)
        client = await volunteer.replicate_p2p()
        me = volunteer.peer_id.to_base58()
        reply = await join(
            client, coordinator.peer_id.to_base58(), m.JoinRequest(JOB, token, "rollout", "cpu", 0.0)
        )
        assert reply.accepted, reply.reason

        def record(expires_at: float) -> VolunteerRecord:  # admitted, still pulling its first weights
            return VolunteerRecord(me, "rollout", "cpu:honest", 5.0, -1, expires_at)

        heartbeat = Heartbeat(
            volunteer, JOB, record, interval=2.0, ttl=30.0, private_key=admitted_key(JOB, token)
        )
        await heartbeat.beat()
        try:
            # The first read may outlast its timeout on a loaded machine (a poll that times out keeps
            # what it knew, which is nothing yet): poll until the volunteer is first seen, 20 polls at most.
            for _ in range(20):
                await hub.poll_once()
                if hub.live_records("rollout"):
                    break
            seen = []
            for _ in range(3):  # three polls in a row, each sees the honest volunteer and nothing else
                began = time.perf_counter()
                await hub.poll_once()
                print(f"coordinator poll under a flood of {FLOOD}: {time.perf_counter() - began:.2f}s")
                seen.append(sorted(r.peer_id for r in hub.live_records("rollout")))
            assert seen == [[me]] * 3, seen
            # The job's whole key does hold the flood: that is what the coordinator no longer reads.
            began = time.perf_counter()
            flooded, _ = await asyncio.wait_for(read_records(coordinator, JOB), 300)
            print(
                f"a read of the job's whole key: {len(flooded)} records, {time.perf_counter() - began:.2f}s"
            )
            assert len(flooded) > FLOOD // 2
        finally:
            await heartbeat.stop()
    finally:
        stranger.stdin.close()
        stranger.kill() if stranger.poll() is None else None
        stranger.wait(60)
        for dht in (volunteer, coordinator, bootstrap):
            dht.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "flood":
        _flood(sys.argv[2], sys.argv[3], int(sys.argv[4]))
