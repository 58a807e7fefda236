"""The job's DHT attacked by a stranger: real hivemind peers, each in its own process.

A job's bootstrap (`dverl dht --job`, with the identity issued in the job's credentials) and an honest
volunteer (a separate process announcing its record) run; a stranger with no key but the job's name
starts its own peer and tries to write a record under the volunteer's sub-key with an expiry of its
choosing, to evict the volunteer's record (a plain value over the whole key), and to pose as the bootstrap.
Every peer of the job checks that a record under the volunteer key is signed by the peer its sub-key
names, so readers see the volunteer's own record, unchanged, and nothing the stranger wrote.

Run as a script (`script_argv(__file__, "volunteer", MADDR, JOB)`) this file is that volunteer.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from decentralized_verl.security.credentials import issue, write
from tests.support.processes import ProcessGroup, free_port, script_argv

JOB = "dht-attack"
pytestmark = pytest.mark.usefixtures("collected_before_fork")


def volunteer_main(maddr: str, job: str) -> None:
    """An honest volunteer: announce a record (signed with its own key), print its id, stay."""
    from decentralized_verl.volunteers.announce import VolunteerRecord, store_record
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    dht = start_dht(
        PeerOptions(initial_peers=(maddr,), host_maddrs=("/ip4/127.0.0.1/tcp/0",), signed_job=job)
    )
    me = dht.peer_id.to_base58()
    record = VolunteerRecord(me, "rollout", "cpu:honest", 10.0, 0, time.time() + 120.0)
    assert asyncio.run(store_record(dht, job, record))
    print(f"announced {me} expires {record.expires_at!r}", flush=True)
    time.sleep(600)


def start_bootstrap(procs: ProcessGroup, tmp_path: Path, name: str, credentials) -> tuple[int, str, str]:
    port = free_port()
    folder = write(tmp_path / name, credentials, "dht")
    procs.start(
        name,
        ["dverl-dht", "--port", str(port), "--job", JOB, "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}"],
        {"DVERL_TLS_DIR": str(folder)},
    )
    maddr = procs.wait_for(name, r"--initial-peers (\S+)").group(1)
    return port, maddr, procs.wait_for(name, r"Peer ID: (\S+)").group(1)


@pytest.fixture
def procs(tmp_path: Path):
    group = ProcessGroup(tmp_path)
    yield group
    group.close()


def test_a_stranger_cannot_write_evict_or_impersonate_on_the_jobs_dht(tmp_path: Path, procs) -> None:
    from decentralized_verl.security.peer_identity import bootstrap_maddr
    from decentralized_verl.volunteers.announce import VolunteerRecord, job_key, read_records
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    first, second = issue(JOB, "local"), issue(JOB, "local")  # two jobs under one public name
    port, maddr, peer = start_bootstrap(procs, tmp_path, "dht", first)
    # The bootstrap is the identity issued with its job's credentials: another job of the same name has
    # another one, and the learner dials it from host:port and the credentials alone.
    assert peer == first.dht_peer != second.dht_peer
    assert bootstrap_maddr(f"127.0.0.1:{port}", first.dht_peer) == maddr
    _, _, other_peer = start_bootstrap(procs, tmp_path, "dht-other", second)
    assert other_peer == second.dht_peer
    procs.stop("dht-other")

    procs.start("volunteer", script_argv(__file__, "volunteer", maddr, JOB))
    announced = procs.wait_for("volunteer", r"announced (\S+) expires (\S+)", timeout=90)
    victim, expiry = announced.group(1), float(announced.group(2))

    # The stranger runs a peer of its own (no validator: it stores whatever it is told) that knows the job.
    host = ("/ip4/127.0.0.1/tcp/0",)
    stranger = start_dht(PeerOptions(initial_peers=(maddr,), host_maddrs=host))
    reader = start_dht(PeerOptions(initial_peers=(maddr,), host_maddrs=host, signed_job=JOB))
    try:
        key = job_key(JOB)
        forged = VolunteerRecord(victim, "rollout", "cpu:forged", 1e9, 99, time.time() + 3600).to_value()
        attempts = {
            "a record in the volunteer's name, expiring in an hour": stranger.store(
                key, forged, time.time() + 3600, subkey=victim
            ),
            "a plain value over the whole key": stranger.store(key, "evicted", time.time() + 7200),
            "an unsigned record under its own id": stranger.store(
                key,
                VolunteerRecord(
                    stranger.peer_id.to_base58(), "rollout", "x", 1.0, 0, time.time() + 60
                ).to_value(),
                time.time() + 60,
                subkey=stranger.peer_id.to_base58(),
            ),
        }
        del attempts  # the stranger's own peer keeps what it stored; the job's peers refuse it all
        found = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = reader.get(key, latest=True)
            if found is not None and isinstance(found.value, dict) and victim in found.value:
                break
            time.sleep(0.5)
        assert found is not None and isinstance(found.value, dict), found
        assert set(found.value) == {victim}, found.value  # nothing the stranger wrote
        entry = found.value[victim]
        assert entry.expiration_time == pytest.approx(expiry)  # the volunteer's own expiry
        records, problems = asyncio.run(read_records(reader, JOB))
        assert [(r.peer_id, r.hardware, r.tokens_per_second) for r in records] == [
            (victim, "cpu:honest", 10.0)
        ]
        assert problems == []
    finally:
        stranger.shutdown()
        reader.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "volunteer":
        volunteer_main(sys.argv[2], sys.argv[3])
