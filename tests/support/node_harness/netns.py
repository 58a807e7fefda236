"""The node's pod network: one Linux bridge with the node's address, and per pod a network namespace
joined to it by a veth pair, with its own IP. Pods reach each other (and the host reaches pods) over
real sockets, as on a cluster's pod network; a pod's ports are its own, so every pod binds 50051.

Names carry the test process's pid, the bridge's number and a counter, and every link and namespace is
removed by `Bridge.close` even when a test fails, so runs side by side never meet.

Several nodes have a bridge (a pod subnet) each; a `Router` namespace with a leg on every bridge forwards
between them, and each pod gets a route to the other nodes' subnets through the router's leg on its own
bridge, so pods on different nodes reach each other by routing, as on a cluster's pod network (host-gw
style). The host reaches every pod directly (it sits on every bridge), as the API server and kubelet do.
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
_bridges = itertools.count()
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


def _tag() -> str:
    """The pid in base 36 and the bridge's number: short enough for 15-character link names."""
    n, digits = os.getpid(), ""
    while n:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
    return f"{digits}{next(_bridges)}"


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

    tag: str = field(default_factory=_tag)
    subnet: ipaddress.IPv4Network | None = None
    """Chosen when the bridge opens (after the bridges opened before it took theirs)."""
    name: str = ""
    routes: list[tuple[str, str]] = field(default_factory=list)
    """(subnet, via) added to every pod's namespace: the other nodes' pod subnets through the router."""
    _hosts: itertools.count = field(default_factory=lambda: itertools.count(2))
    _counter: itertools.count = field(default_factory=lambda: itertools.count())
    _live: dict[str, PodNetwork] = field(default_factory=dict)
    _open: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or f"dvb{self.tag}"[:15]

    @property
    def net(self) -> ipaddress.IPv4Network:
        assert self.subnet is not None, "the bridge is not open"
        return self.subnet

    @property
    def gateway(self) -> str:
        return str(self.net.network_address + 1)

    @property
    def router_address(self) -> str:
        """The router's leg on this bridge (the subnet's last host address)."""
        return str(self.net.broadcast_address - 1)

    def open(self) -> Bridge:
        """Idempotent: a multi-node setup opens bridges before their nodes do, to route between them."""
        if self._open:
            return self
        self._open = True
        if self.subnet is None:
            self.subnet = free_subnet()
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.net.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")
        return self

    def attach(self) -> PodNetwork:
        """A fresh namespace with loopback up and an address on the bridge (a new one for every pod, as a
        recreated pod gets a new IP on a cluster)."""
        n = next(self._counter)
        host_number = next(self._hosts)
        if host_number >= self.net.num_addresses - 2:
            raise RuntimeError(f"pod network {self.subnet} is full")
        address = str(self.net.network_address + host_number)
        namespace = f"dvn{self.tag}-{n}"
        host_link, pod_link = f"dvh{self.tag}n{n}"[:15], f"dvp{self.tag}n{n}"[:15]
        ip("netns", "add", namespace)
        net = PodNetwork(namespace=namespace, ip=address, host_link=host_link)
        self._live[namespace] = net
        ip("link", "add", host_link, "type", "veth", "peer", "name", pod_link)
        ip("link", "set", pod_link, "netns", namespace)
        ip("link", "set", host_link, "master", self.name, "up")
        ip("-n", namespace, "link", "set", pod_link, "name", "eth0")
        ip("-n", namespace, "addr", "add", f"{address}/{self.net.prefixlen}", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("-n", namespace, "route", "add", "default", "via", self.gateway)
        for subnet, via in self.routes:
            ip("-n", namespace, "route", "add", subnet, "via", via)
        return net

    def detach(self, net: PodNetwork) -> None:
        ip("link", "del", net.host_link, check=False)
        ip("netns", "del", net.namespace, check=False)
        self._live.pop(net.namespace, None)

    def close(self) -> None:
        for net in list(self._live.values()):
            self.detach(net)
        ip("link", "del", self.name, check=False)


@dataclass
class Router:
    """A network namespace forwarding between node bridges: one veth leg per bridge, at the bridge's
    `router_address`, with IP forwarding on inside it only (the host's own setting is left alone)."""

    tag: str = field(default_factory=_tag)
    namespace: str = ""
    _links: list[str] = field(default_factory=list)

    def open(self, bridges: list[Bridge]) -> Router:
        self.namespace = f"dvr{self.tag}"
        ip("netns", "add", self.namespace)
        ip("netns", "exec", self.namespace, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ip("-n", self.namespace, "link", "set", "lo", "up")
        for i, bridge in enumerate(bridges):
            outside, inside = f"dvq{self.tag}x{i}"[:15], f"leg{i}"
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._links.append(outside)
            ip("link", "set", inside, "netns", self.namespace)
            ip("link", "set", outside, "master", bridge.name, "up")
            ip(
                "-n",
                self.namespace,
                "addr",
                "add",
                f"{bridge.router_address}/{bridge.net.prefixlen}",
                "dev",
                inside,
            )
            ip("-n", self.namespace, "link", "set", inside, "up")
        for bridge in bridges:
            bridge.routes = [
                (str(other.net), bridge.router_address) for other in bridges if other is not bridge
            ]
        return self

    def close(self) -> None:
        for link in self._links:
            ip("link", "del", link, check=False)
        if self.namespace:
            ip("netns", "del", self.namespace, check=False)
