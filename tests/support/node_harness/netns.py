"""The node's pod network: one Linux bridge with the node's address, and per pod a network namespace
joined to it by a veth pair, with its own IP. Pods reach each other (and the host reaches pods) over
real sockets, as on a cluster's pod network; a pod's ports are its own, so every pod binds 50051.

Names carry the test process's pid and a counter, and every link and namespace is removed by
`Bridge.close` even when a test fails, so runs side by side never meet.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import subprocess
from dataclasses import dataclass, field

IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "ip"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)


_probes = itertools.count()
REFUSALS = ("Operation not permitted", "Permission denied")
"""What `ip netns add` says where the machine does not let this user make namespaces (no root, no
CAP_SYS_ADMIN, a container without them): the only refusal that holds on every run."""


def refused() -> str | None:
    """Why this machine cannot give pods namespaces (None: it can). Probes by making one and removing it.

    Only a refusal that holds on every run of this machine is a reason (no `ip` command, no permission);
    anything else (a slow `ip` under load, a name left behind) is an error, not a reason to skip."""
    name = f"dvprobe{os.getpid()}x{next(_probes)}"
    try:
        made = ip("netns", "add", name, check=False)
    except FileNotFoundError as exc:
        return f"`ip netns add` cannot run here: {exc}"
    if made.returncode != 0:
        if any(words in made.stderr for words in REFUSALS):
            return f"`ip netns add` refused (needs root or CAP_SYS_ADMIN): {made.stderr.strip()}"
        raise RuntimeError(f"`ip netns add {name}` failed: {made.stderr.strip()}")
    ip("netns", "del", name, check=False)
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.240.0.0/12 that no route on this machine uses, chosen from the pid so runs side by
    side start in different places."""
    used = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in ip("-4", "route", "show").stdout.splitlines()
        if line and line.split()[0][0].isdigit()
    ]
    pool = list(ipaddress.ip_network("10.240.0.0/12").subnets(new_prefix=24))
    start = os.getpid() % len(pool)
    for net in pool[start:] + pool[:start]:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /24 under 10.240.0.0/12 for the pod network")


@dataclass
class PodNetwork:
    namespace: str
    ip: str
    host_link: str


@dataclass
class Bridge:
    """The node's bridge; `attach` gives a pod its namespace and address, `detach` takes them away."""

    tag: str = field(default_factory=lambda: str(os.getpid()))
    subnet: ipaddress.IPv4Network = field(default_factory=free_subnet)
    name: str = ""
    _hosts: itertools.count = field(default_factory=lambda: itertools.count(2))
    _counter: itertools.count = field(default_factory=lambda: itertools.count())
    _live: dict[str, PodNetwork] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or f"dvb{self.tag}"[:15]

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def open(self) -> Bridge:
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")
        return self

    def attach(self) -> PodNetwork:
        """A fresh namespace with loopback up and an address on the bridge (a new one for every pod, as a
        recreated pod gets a new IP on a cluster)."""
        n = next(self._counter)
        host_number = next(self._hosts)
        if host_number >= self.subnet.num_addresses - 1:
            raise RuntimeError(f"pod network {self.subnet} is full")
        address = str(self.subnet.network_address + host_number)
        namespace = f"dvn{self.tag}-{n}"
        host_link, pod_link = f"dvh{self.tag}n{n}"[:15], f"dvp{self.tag}n{n}"[:15]
        ip("netns", "add", namespace)
        net = PodNetwork(namespace=namespace, ip=address, host_link=host_link)
        self._live[namespace] = net
        ip("link", "add", host_link, "type", "veth", "peer", "name", pod_link)
        ip("link", "set", pod_link, "netns", namespace)
        ip("link", "set", host_link, "master", self.name, "up")
        ip("-n", namespace, "link", "set", pod_link, "name", "eth0")
        ip("-n", namespace, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("-n", namespace, "route", "add", "default", "via", self.gateway)
        return net

    def detach(self, net: PodNetwork) -> None:
        ip("link", "del", net.host_link, check=False)
        ip("netns", "del", net.namespace, check=False)
        self._live.pop(net.namespace, None)

    def close(self) -> None:
        for net in list(self._live.values()):
            self.detach(net)
        ip("link", "del", self.name, check=False)
