"""One volunteer process's stay on the DHT: join, announce itself with a heartbeat, leave cleanly.

The token-checked worker (worker.py) and the open quick-start worker (open_worker.py) differ in what they
serve, not in how they come and go; keeping that here means the order that matters on the way out
(heartbeat stopped before the DHT shuts down, so no record is re-stored by a dying peer) is written once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord
from decentralized_verl.volunteers.dht import PeerOptions, start_dht


class ReachOptions(Protocol):
    """The command-line options both worker kinds share: how to reach the DHT and how often to announce."""

    initial_peers: tuple[str, ...]
    job: str
    port: int
    host_maddrs: tuple[str, ...]
    announce_maddrs: tuple[str, ...]
    client_mode: bool
    use_relay: bool
    use_auto_relay: bool
    heartbeat_s: float
    ttl_s: float


def peer_options(options: ReachOptions) -> PeerOptions:
    """Listen on all interfaces at `--port` unless explicit multiaddrs were given."""
    return PeerOptions(
        initial_peers=options.initial_peers,
        host_maddrs=options.host_maddrs or (f"/ip4/0.0.0.0/tcp/{options.port}",),
        announce_maddrs=options.announce_maddrs,
        client_mode=options.client_mode,
        use_relay=options.use_relay,
        use_auto_relay=options.use_auto_relay,
    )


class VolunteerSession:
    """A started DHT peer and, once `announce` is called, the heartbeat that keeps its record alive."""

    def __init__(self, dht, options: ReachOptions) -> None:
        self.dht = dht
        self.options = options
        self.me: str = dht.peer_id.to_base58()
        self._heartbeat: Heartbeat | None = None

    async def p2p(self):
        return await self.dht.replicate_p2p()

    async def announce(self, make_record: Callable[[float], VolunteerRecord]) -> None:
        """Store the record now (so the peer is findable before this returns), then every heartbeat_s."""
        heartbeat = Heartbeat(
            self.dht, self.options.job, make_record, interval=self.options.heartbeat_s, ttl=self.options.ttl_s
        )
        await heartbeat.beat()
        heartbeat.start()
        self._heartbeat = heartbeat

    async def close(self) -> None:
        if self._heartbeat is not None:
            await self._heartbeat.stop()
        self.dht.shutdown()


@asynccontextmanager
async def volunteer_session(options: ReachOptions) -> AsyncIterator[VolunteerSession]:
    """Start the DHT peer off the event loop (it blocks while bootstrapping); always leave on exit."""
    dht = await asyncio.to_thread(start_dht, peer_options(options))
    session = VolunteerSession(dht, options)
    try:
        yield session
    finally:
        await session.close()
