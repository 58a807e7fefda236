"""Hosts on emulated links (testing/netlab): each process in its own network namespace with its
own address, links shaped by tc tbf (bandwidth) and the userspace link relay (latency, jitter, loss), and
partitions that cut a host off and bring it back. Skipped with the reason where namespaces are refused.

The link checks assert lower bounds only (a delayed link can never be faster than its delay; a load on
the machine only makes things slower), so they hold on a busy 2-core machine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from netlab.hosts import NetlabError, Network, namespaces_refused
from netlab.jobs import HostJob
from netlab.manifests import volunteer_job
from netlab.profiles import PROFILES, LinkProfile, ProfileError, profile, tbf_args

from tests.support.job_manifests import TOY

REFUSED = namespaces_refused()
needs_netns = pytest.mark.skipif(REFUSED is not None, reason=f"network namespaces refused: {REFUSED}")


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


# ------------------------------------------------------------------------------------- profiles
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate_mbit": 0}, "rate_mbit"),
        ({"rate_mbit": -5}, "rate_mbit"),
        ({"rtt_ms": -1}, "rtt_ms"),
        ({"rtt_ms": 10, "jitter_ms": 6}, "jitter_ms"),
        ({"loss": 1.0}, "loss"),
        ({"loss": -0.1}, "loss"),
    ],
)
def test_bad_link_profiles_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ProfileError, match=field):
        LinkProfile("bad", **kwargs)


def test_profiles_and_token_bucket() -> None:
    assert not profile("lan").needs_relay and profile("home20").needs_relay
    assert profile("home20").one_way_delays() == (0.075, 0.005)
    assert PROFILES["home100"].rate_mbit == 100
    with pytest.raises(ProfileError, match="expected one of"):
        profile("dialup")
    args = tbf_args(20)
    assert args[:3] == ["tbf", "rate", "20mbit"]
    burst, limit = int(args[args.index("burst") + 1]), int(args[args.index("limit") + 1])
    assert burst >= 3000 and limit == 250_000  # 100 ms of 20 Mbit/s


# ------------------------------------------------------------------------------------ the harness
SERVE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen(); print("listening", flush=True)
while True:
    c, _ = s.accept(); n = 0
    while (d := c.recv(1 << 16)):
        n += len(d)
    c.sendall(str(n).encode()); c.close()
"""


def _send(net: Network, host: str, to: str, nbytes: int, timeout: float = 60) -> tuple[int, float, float]:
    """(bytes the server counted, connect seconds, total seconds) for `nbytes` sent from `host`."""
    code = (
        "import socket, sys, time\n"
        f"t = time.monotonic(); c = socket.create_connection(({to!r}, 9000), timeout=20)\n"
        "connected = time.monotonic() - t\n"
        f"c.sendall(b'x' * {nbytes}); c.shutdown(socket.SHUT_WR)\n"
        "n = int(c.recv(64)); print(n, connected, time.monotonic() - t)\n"
    )
    done = net.exec(host, [sys.executable, "-c", code], timeout=timeout)
    assert done.returncode == 0, done.stderr
    n, connected, total = done.stdout.split()
    return int(n), float(connected), float(total)


@needs_netns
def test_hosts_links_and_partitions() -> None:
    before = _netns_names()
    with Network(seed=3) as net:
        server = net.add_host("server")
        net.add_host("lan")
        net.add_host("slow", LinkProfile("slow", rate_mbit=8, rtt_ms=200, jitter_ms=10, loss=0.02))
        net.add_host("thin", LinkProfile("thin", rate_mbit=4))
        made = _netns_names() - before
        assert len(made) == 5 and all(n.startswith(net.tag) for n in made)
        serving = net.spawn("server", [sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
        assert serving.stdout.readline().strip() == "listening"

        assert _send(net, "lan", server.address, 100_000)[0] == 100_000
        # Latency: the TCP handshake takes one round trip, which the relay makes >= 200 ms (minus jitter
        # both ways). Loss: 2 % of packets each way are dropped and TCP still delivers every byte.
        n, connected, _ = _send(net, "slow", server.address, 300_000)
        assert n == 300_000 and connected >= 0.18
        # Bandwidth: 1 MB cannot cross a 4 Mbit/s bucket in less than ~2 s (minus one burst).
        n, _, total = _send(net, "thin", server.address, 1_000_000)
        assert n == 1_000_000 and total >= 1.8

        net.partition("slow")
        assert net.partitioned("slow")
        cut = net.exec(
            "slow",
            [
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(({server.address!r}, 9000), timeout=2)",
            ],
        )
        assert cut.returncode != 0 and "timed out" in cut.stderr
        net.heal("slow")
        assert _send(net, "slow", server.address, 10_000)[0] == 10_000

        with pytest.raises(NetlabError, match="already exists"):
            net.add_host("lan")
        with pytest.raises(NetlabError, match="host name"):
            net.add_host("Bad Name")
    assert _netns_names() == before  # namespaces, links, relays and the server: all gone


@needs_netns
def test_teardown_after_a_failure() -> None:
    before = _netns_names()
    with pytest.raises(RuntimeError, match="boom"), Network() as net:
        net.add_host("a", LinkProfile("x", rtt_ms=20))
        relay = net.hosts["a"].relay
        raise RuntimeError("boom")
    assert relay is not None and relay.poll() is not None
    assert _netns_names() == before


# --------------------------------------------------------------------- volunteers across hosts
SECRET = "wan-hosts-secret-0123456789abcdef"


@needs_netns
@pytest.mark.usefixtures("collected_before_fork")
def test_volunteer_on_a_slow_lossy_link_serves_every_step_and_a_partitioned_one_rejoins(
    tmp_path: Path,
) -> None:
    """A volunteer behind 20 Mbit/s, 150 ms and 1 % loss gets work at every policy version; a LAN volunteer
    cut off mid-job has its share hedged on the others (nothing lost or counted twice), and once
    reconnected pulls the weights it missed and serves later steps."""
    from decentralized_verl.volunteers.tokens import issue_token

    job, steps, port = "wan-hosts", 14, 31337
    with Network(seed=7) as net:
        net.add_host("dht")
        net.add_host("coord")
        net.add_host("near")
        net.add_host("far", PROFILES["home20"])
        procs = HostJob(net, tmp_path)
        maddr = procs.start_dht("dht", job, port)
        assert maddr.startswith(f"/ip4/{net.hosts['dht'].address}/")
        out = tmp_path / "run"
        procs.start_learner(
            "coord",
            volunteer_job(
                tmp_path,
                job,
                TOY / "train.jsonl",
                **{"training.steps": steps, "volunteers.verifyFraction": 0.25},
            ),
            out,
            {
                "DVERL_DHT_ADDR": maddr,  # what the bootstrap printed: its identity is random
                "DVERL_JOIN_SECRET": SECRET,
                "DVERL_WAIT_VOLUNTEERS": "2:240",
                "DVERL_VOLUNTEER_POLL_S": "0.5",
            },
        )
        for name in ("near", "far"):  # a join token admits one peer identity
            procs.start_volunteer(name, maddr, job, issue_token(SECRET.encode(), job, 3600))
        far_peer, near_peer = procs.volunteer_peer("far", 240), procs.volunteer_peer("near", 240)
        procs.wait_for("near", r"at policy v1\b")
        net.partition("near")
        procs.wait_for("learner", rf"share of volunteer-{near_peer[-8:]} is late", 240)
        net.heal("near")
        assert procs.procs["learner"].wait(400) == 0, procs.log("learner")[-4000:]

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((out / "volunteers.json").read_text())
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    # The cut volunteer's share was hedged on others (seconds, not its 30 s+ deadline): none of it lost.
    assert sum(r["hedged"] for r in records) > 0
    far_versions = {int(v) for v in re.findall(r"at policy v(\d+)", procs.log("far"))}
    assert far_versions == set(range(steps)), far_versions  # the far volunteer worked at every version
    near_versions = [int(v) for v in re.findall(r"at policy v(\d+)", procs.log("near"))]
    assert max(near_versions) >= 3, near_versions  # back, it pulled versions it missed and served them
    assert report["samples"][far_peer]["accepted"] > 0 and report["samples"][near_peer]["accepted"] > 0
    assert not report["blocked"]
