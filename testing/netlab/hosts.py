"""Hosts, not ports: every process of a test or benchmark on its own network namespace and address.

One router namespace holds a bridge (10.31.0.254/24). A host with a plain link is a namespace whose
`eth0` is a veth on that bridge (10.31.0.N). A host with latency, jitter or loss gets a TUN `eth0`
(10.31.1.N) carried to the router by its own `link_relay` process; the router forwards between the two
subnets. Bandwidth is a tc `tbf` on both ends of a host's link. `partition(host)` takes the host's
router-side port down (packets vanish, connections hang as on a cut line); `heal(host)` brings it back.

Every name carries this process's pid and a counter, so concurrent runs never collide, and `close()`
(also on errors, as a context manager) ends what was started in the hosts, then the relays, then
deletes the namespaces, which takes their links with them. `sweep_stale()` removes what a killed run
left behind. Only addresses inside these namespaces are ever used.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netlab.profiles import LinkProfile, tbf_args

PREFIX = "dvl"
LINK_RELAY = Path(__file__).with_name("link_relay.py")
"""Run by its path inside the router namespace (the standard library is all it imports)."""
ROUTER_ADDRESS = "10.31.0.254"
_counter = itertools.count()
_NAME = re.compile(rf"^{PREFIX}(\d+)x\d+[rh]\d*$")


class NetlabError(RuntimeError):
    """A namespace, link or relay that could not be made; the message names it and the command."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetlabError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def namespaces_refused() -> str | None:
    """Why this machine cannot run the harness (not root, no `ip`, no TUN), or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun for the link relay"
    probe = f"{PREFIX}{os.getpid()}x{next(_counter)}r"
    try:
        done = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the `ip` command is missing"
    if done.returncode != 0:
        if "Operation not permitted" in done.stderr or "Permission denied" in done.stderr:
            return f"`ip netns add` refused: {done.stderr.strip()}"
        raise RuntimeError(f"`ip netns add {probe}` failed: {done.stderr.strip()}")  # not the machine's rule
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete namespaces of this harness whose creating process is gone (a run killed mid-test)."""
    removed = []
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class Host:
    """One namespace: its name, address, link, and the router-side device its link ends in."""

    name: str
    netns: str
    address: str
    link: LinkProfile
    port: str
    relay: subprocess.Popen | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]


class Network:
    """A router and the hosts added to it; a context manager that always tears everything down."""

    def __init__(self, *, seed: int = 0) -> None:
        self.tag = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.router = f"{self.tag}r"
        self.seed = seed
        self.hosts: dict[str, Host] = {}
        self._partitioned: set[str] = set()
        self._closed = False
        sweep_stale()
        try:
            _ip("netns", "add", self.router)
            _ip("-n", self.router, "link", "set", "lo", "up")
            _ip("-n", self.router, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.router, "addr", "add", f"{ROUTER_ADDRESS}/24", "dev", "br0")
            _ip("-n", self.router, "link", "set", "br0", "up")
            self._sysctl(self.router, "net/ipv4/ip_forward", "1")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _sysctl(netns: str, key: str, value: str) -> None:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, "sh", "-c", f"echo {value} > /proc/sys/{key}"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise NetlabError(f"{netns}: cannot set {key}={value}: {done.stderr.strip()}")

    def add_host(self, name: str, link: LinkProfile | None = None) -> Host:
        """A new namespace on this network with `link` between it and the router."""
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,30}", name):
            raise NetlabError(f"host name {name!r}: lower-case letters, digits, '-' or '_' (<= 31)")
        if name in self.hosts:
            raise NetlabError(f"host {name!r} already exists on this network")
        link = link or LinkProfile()
        n = len(self.hosts) + 1
        if n > 200:
            raise NetlabError("a network holds at most 200 hosts")
        netns = f"{self.tag}h{n}"
        _ip("netns", "add", netns)
        host = Host(name, netns, "", link, port="")
        self.hosts[name] = host
        _ip("-n", netns, "link", "set", "lo", "up")
        if link.needs_relay:
            self._relayed(host, n)
        else:
            self._bridged(host, n)
        if link.rate_mbit is not None:
            for netns_, dev in ((netns, "eth0"), (self.router, host.port)):
                _ip("-n", netns_, "link", "set", dev, "txqueuelen", "1000")
                subprocess.run(
                    ["tc", "-n", netns_, "qdisc", "replace", "dev", dev, "root", *tbf_args(link.rate_mbit)],
                    check=True,
                    capture_output=True,
                )
        return host

    def _bridged(self, host: Host, n: int) -> None:
        host.port, host.address = f"p{n}", f"10.31.0.{n}"
        _ip(
            "-n",
            self.router,
            "link",
            "add",
            host.port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.netns,
        )
        _ip("-n", self.router, "link", "set", host.port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "route", "add", "10.31.0.0/16", "via", ROUTER_ADDRESS)

    def _relayed(self, host: Host, n: int) -> None:
        host.port, host.address = f"t{n}", f"10.31.1.{n}"
        link = host.link
        relay = subprocess.Popen(
            [
                "ip", "netns", "exec", self.router,
                sys.executable, str(LINK_RELAY),
                "--host-netns", f"/run/netns/{host.netns}", "--router-dev", host.port,
                "--rtt-ms", str(link.rtt_ms), "--jitter-ms", str(link.jitter_ms), "--loss", str(link.loss),
                "--seed", str(self.seed * 1000 + n),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        host.relay = relay
        line = relay.stdout.readline() if relay.stdout else ""
        if line.strip() != "ready":
            relay.kill()
            raise NetlabError(f"link relay for {host.name} did not start: {relay.stderr.read().strip()}")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/32", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "route", "add", "10.31.0.0/16", "dev", "eth0")
        self._router_port_up(host)

    def _router_port_up(self, host: Host) -> None:
        _ip("-n", self.router, "link", "set", host.port, "up")
        if host.relay is not None:
            _ip("-n", self.router, "route", "replace", f"{host.address}/32", "dev", host.port)

    # ------------------------------------------------------------------------------------- faults
    def partition(self, name: str) -> None:
        """Cut `name` off from every other host; its packets are lost silently in both directions."""
        host = self.hosts[name]
        _ip("-n", self.router, "link", "set", host.port, "down")
        self._partitioned.add(name)

    def heal(self, name: str) -> None:
        """Reconnect a partitioned host (its address, link profile and processes are unchanged)."""
        self._router_port_up(self.hosts[name])
        self._partitioned.discard(name)

    def partitioned(self, name: str) -> bool:
        return name in self._partitioned

    # ---------------------------------------------------------------------------------- processes
    def spawn(self, name: str, argv: Sequence[str], **popen) -> subprocess.Popen:
        """Start `argv` inside host `name` in its own session; `close()` ends it (and what it started)."""
        host = self.hosts[name]
        proc = subprocess.Popen(host.command(argv), start_new_session=True, **popen)
        host.processes.append(proc)
        return proc

    def exec(self, name: str, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a short command in host `name` and wait for it."""
        return subprocess.run(self.hosts[name].command(argv), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        procs = [p for h in self.hosts.values() for p in h.processes]
        relays = [h.relay for h in self.hosts.values() if h.relay is not None]
        for proc in procs + relays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in procs + relays:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
        _ip("netns", "del", self.router, check=False)
