"""Ports handed to workers come from below the kernel's ephemeral range and outside the ranges Ray takes by
number, so no port-0 listener, outgoing connection or Ray process can take one between the pick and the
worker's bind, and a Ray head accepts one as its port."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from decentralized_verl.runtime.ports import (
    CLAIMED,
    ephemeral_floor,
    nth_port,
    open_ranges,
)


def test_the_open_ranges_leave_out_every_claimed_range() -> None:
    assert open_ranges(32768) == [range(10000, 10001), range(20000, 32768)]
    assert open_ranges(15000) == [range(10000, 10001)]  # room for one: free_port asks the kernel instead
    assert open_ranges(60000) == [range(10000, 10001), range(20000, 52365), range(52366, 60000)]
    spans = open_ranges(32768)
    assert [nth_port(spans, i) for i in (0, 1, 2)] == [10000, 20000, 20001]
    assert nth_port(spans, sum(len(s) for s in spans) - 1) == 32767


def test_the_floor_falls_back_when_the_range_cannot_be_read(tmp_path: Path) -> None:
    assert ephemeral_floor(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_floor(tmp_path / "range") == 40000


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
    assert [port for port in taken if not any(port in claimed for claimed in CLAIMED)] == []
