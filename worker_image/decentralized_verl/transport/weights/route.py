"""Fan-out routes: which rollout worker forwards a weight version to which (pure; no I/O).

A route is a forest of `Hop`s; it travels as compact JSON in the Push call's metadata
(``dverl-fanout-route``), so each relay learns its own subtree from the call that feeds it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from decentralized_verl.errors import WireError

ROUTE_KEY = "dverl-fanout-route"


@dataclass(frozen=True)
class Hop:
    """One receiver of a fan-out and the subtree it forwards to."""

    address: str
    children: tuple[Hop, ...] = ()

    def addresses(self) -> list[str]:
        return [self.address, *(a for c in self.children for a in c.addresses())]


def plan_chain(addresses: Sequence[str]) -> tuple[Hop, ...]:
    """A chain: the sender feeds the first address, each receiver the next (depth N, one copy per link)."""
    hop: Hop | None = None
    for address in reversed(addresses):
        hop = Hop(address, () if hop is None else (hop,))
    return () if hop is None else (hop,)


def plan_tree(addresses: Sequence[str], fanout: int) -> tuple[Hop, ...]:
    """A breadth-first ``fanout``-ary tree: the sender feeds the first ``fanout`` addresses, node i feeds
    nodes ``fanout*(i+1) .. fanout*(i+1)+fanout-1``. Depth ~ log_fanout(N); each node sends ``fanout``
    copies. ``fanout=1`` is `plan_chain`."""
    if fanout < 1:
        raise ValueError(f"fanout: must be >= 1 (got {fanout})")
    addresses = list(addresses)

    def build(i: int) -> Hop:
        kids = range(fanout * (i + 1), min(fanout * (i + 1) + fanout, len(addresses)))
        return Hop(addresses[i], tuple(build(k) for k in kids))

    return tuple(build(i) for i in range(min(fanout, len(addresses))))


CHAIN_MAX_RECEIVERS = 8
"""Up to this many receivers `plan_route` uses a chain, beyond it a binary tree."""


def plan_route(addresses: Sequence[str]) -> tuple[Hop, ...]:
    """The runtime's route: a chain for up to `CHAIN_MAX_RECEIVERS` receivers, a binary tree beyond.

    Picked by N because the spec has no field for it. In a chain every node uploads exactly one copy
    and the depth costs one chunk's transfer per hop (time ~ size/bandwidth + N * chunk/bandwidth); in a
    binary tree inner nodes upload two copies (half the bandwidth each on a shared uplink) to cut the
    depth to log2 N. With 4 MiB chunks a hop costs a few ms against hundreds of ms for a model, so for
    the usual handful of rollout workers the chain is as fast or faster (the loopback benchmark agrees,
    BENCHMARKS.md); with many workers the chain's N hops (and the longer repair after a failure) add up,
    and the tree's log depth wins.
    """
    if len(addresses) <= CHAIN_MAX_RECEIVERS:
        return plan_chain(addresses)
    return plan_tree(addresses, 2)


def route_to_json(hops: Iterable[Hop]) -> str:
    def enc(h: Hop) -> list:
        return [h.address, [enc(c) for c in h.children]]

    return json.dumps([enc(h) for h in hops], separators=(",", ":"))


def route_from_json(text: str) -> tuple[Hop, ...]:
    """Parse a route from metadata; anything malformed is a `WireError` naming the route."""

    def dec(node: object, path: str) -> Hop:
        if not (isinstance(node, list) and len(node) == 2 and isinstance(node[0], str) and node[0]):
            raise WireError(path, "must be [address, [children...]] with a non-empty address")
        if not isinstance(node[1], list):
            raise WireError(f"{path}.children", "must be a list")
        return Hop(node[0], tuple(dec(c, f"{path}.children[{i}]") for i, c in enumerate(node[1])))

    try:
        raw = json.loads(text)
    except ValueError:
        raise WireError(ROUTE_KEY, "is not valid JSON") from None
    if not isinstance(raw, list):
        raise WireError(ROUTE_KEY, "must be a list of hops")
    return tuple(dec(node, f"{ROUTE_KEY}[{i}]") for i, node in enumerate(raw))
