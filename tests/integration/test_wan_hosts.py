"""Hosts on emulated links (testing/netlab): each process in its own network namespace with its
own address, links shaped by tc tbf (bandwidth) and the userspace link relay (latency, jitter, loss), and
partitions that cut a host off and bring it back. Skipped with the reason where namespaces are refused.

The link checks assert lower bounds only (a delayed link can never be faster than its delay; a load on
the machine only makes things slower), so they hold on a busy 2-core machine.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from netlab.hosts import NetlabError, Network, namespaces_refused
from netlab.profiles import LinkProfile

REFUSED = namespaces_refused()
needs_netns = pytest.mark.skipif(REFUSED is not None, reason=f"network namespaces refused: {REFUSED}")


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


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
    with Network(seed=3) as net:  # only this network's namespaces count: other runs may make their own
        tag = net.tag
        server = net.add_host("server")
        net.add_host("lan")
        net.add_host("slow", LinkProfile("slow", rate_mbit=8, rtt_ms=200, jitter_ms=10, loss=0.02))
        net.add_host("thin", LinkProfile("thin", rate_mbit=4))
        made = {n for n in _netns_names() if n.startswith(tag)}
        assert len(made) == 5
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
    assert not {n for n in _netns_names() if n.startswith(tag)}  # namespaces, links, relays, server: gone


@needs_netns
def test_teardown_after_a_failure() -> None:
    with pytest.raises(RuntimeError, match="boom"), Network() as net:
        tag = net.tag
        net.add_host("a", LinkProfile("x", rtt_ms=20))
        relay = net.hosts["a"].relay
        raise RuntimeError("boom")
    assert relay is not None and relay.poll() is not None
    assert not {n for n in _netns_names() if n.startswith(tag)}
