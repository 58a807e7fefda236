"""Ports handed to workers come from below the kernel's ephemeral range and outside the ranges Ray takes by
number, so no port-0 listener, outgoing connection or Ray process can take one between the pick and the
worker's bind, and a Ray head accepts one as its port.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import inspect
import random
import re
import socket

from decentralized_verl.runtime.ports import (
    CLAIMED,
    LOWEST,
    ephemeral_floor,
    free_port,
    nth_port,
    open_ranges,
)


def _claimed(port: int) -> bool:
    return any(port in taken for taken in CLAIMED)


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    floor = ephemeral_floor()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    if sum(len(span) for span in open_ranges(floor)) >= 1000:
        assert all(LOWEST <= p < floor and not _claimed(p) for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # still free to the worker that was handed it


def test_a_port_in_use_is_skipped() -> None:
    spans = open_ranges(ephemeral_floor())
    total = sum(len(span) for span in spans)
    if total < 1000:
        return
    first = nth_port(spans, random.Random(1234).randrange(total))  # what the same seed would pick first
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert free_port(rng=random.Random(1234)) != first


def test_rays_own_default_ports_are_claimed() -> None:
    """What `ray start` takes by number unless told otherwise, read from the installed Ray."""
    from ray._private import ray_constants
    from ray.scripts import scripts

    defaults = {option.name: option.default for option in scripts.start.params}
    client = re.search(r"ray_client_server_port = (\d+)", inspect.getsource(scripts.start.callback))
    assert client is not None, "ray start no longer names its client server's default port"
    taken = [
        ray_constants.DEFAULT_PORT,
        ray_constants.DEFAULT_DASHBOARD_PORT,
        ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT,
        int(client.group(1)),
        *range(defaults["min_worker_port"], defaults["max_worker_port"] + 1),
    ]
    assert [port for port in taken if not _claimed(port)] == []
