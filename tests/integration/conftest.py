"""Fixtures of the integration lane."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def two_peers(collected_before_fork: None) -> Iterator[tuple[Any, Any]]:
    """Two real hivemind DHT peers on 127.0.0.1, the second bootstrapped from the first: (server, caller);
    forked once the garbage earlier tests left is collected (`collected_before_fork`)."""
    import hivemind

    server = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    caller = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=[str(a) for a in server.get_visible_maddrs()],
    )
    yield server, caller
    caller.shutdown()
    server.shutdown()
