"""One volunteer process's stay on the DHT: join, announce itself with a heartbeat, leave cleanly.

The token-checked worker (worker.py) and the open quick-start worker (open_worker.py) differ in what they
serve, not in how they come and go; keeping that here means the order that matters on the way out
(heartbeat stopped before the DHT shuts down, so no record is re-stored by a dying peer) is written once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from decentralized_verl.errors import PeerUnavailable
from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord
from decentralized_verl.volunteers.dht import PeerOptions, start_dht


@dataclass(frozen=True)
class PeerReach:
    """How a process reaches the job's DHT: the options every command that joins one shares (volunteers,
    the open workers, volunteer learners, the quick-start trainer). Only `initial_peers` is positional."""

    initial_peers: tuple[str, ...]
    port: int = field(default=0, kw_only=True)
    host_maddrs: tuple[str, ...] = field(default=(), kw_only=True)
    announce_maddrs: tuple[str, ...] = field(default=(), kw_only=True)
    client_mode: bool = field(default=False, kw_only=True)
    use_relay: bool = field(default=True, kw_only=True)
    use_auto_relay: bool = field(default=False, kw_only=True)

    def peer_options(self) -> PeerOptions:
        """Listen on all interfaces at `port` unless explicit multiaddrs were given."""
        return PeerOptions(
            initial_peers=self.initial_peers,
            host_maddrs=self.host_maddrs or (f"/ip4/0.0.0.0/tcp/{self.port}",),
            announce_maddrs=self.announce_maddrs,
            client_mode=self.client_mode,
            use_relay=self.use_relay,
            use_auto_relay=self.use_auto_relay,
        )


class ReachOptions(Protocol):
    """What a volunteer session needs: how to reach the DHT, the job, and how often to announce."""

    job: str
    heartbeat_s: float
    ttl_s: float

    def peer_options(self) -> PeerOptions: ...


class VolunteerSession:
    """A started DHT peer and, once `announce` is called, the heartbeat that keeps its record alive."""

    def __init__(self, dht, options: ReachOptions) -> None:
        self.dht = dht
        self.options = options
        self.me: str = dht.peer_id.to_base58()
        self.private_key: str | None = None
        """Set once the coordinator admitted this peer (`announce.admitted_key`): records go there too."""
        self._heartbeat: Heartbeat | None = None

    async def p2p(self):
        return await self.dht.replicate_p2p()

    async def announce(self, make_record: Callable[[float], VolunteerRecord]) -> None:
        """Store the record now (so the peer is findable before this returns), then every heartbeat_s."""
        heartbeat = Heartbeat(
            self.dht,
            self.options.job,
            make_record,
            interval=self.options.heartbeat_s,
            ttl=self.options.ttl_s,
            private_key=self.private_key,
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
    """Start the DHT peer off the event loop (it blocks while bootstrapping); always leave on exit.
    PeerUnavailable, saying what to check, when the bootstrap peers cannot be reached."""
    peer = dataclasses.replace(options.peer_options(), signed_job=options.job)  # signs its own record
    try:
        dht = await asyncio.to_thread(start_dht, peer)
    except Exception as exc:
        if "bootstrap" not in str(exc):
            raise
        raise PeerUnavailable(unreachable_dht(peer.initial_peers, options.job, exc)) from None
    session = VolunteerSession(dht, options)
    try:
        yield session
    finally:
        await session.close()


JOB_MUST_RUN = (
    "a volunteer joins a running job: start it first (`dverl run JOB.yaml` on one machine prints the "
    "--initial-peers line once its DHT is up; in a cluster, .status.volunteerGateway says where to dial)"
)


def unreachable_dht(initial_peers: tuple[str, ...], job: str, exc: BaseException) -> str:
    """Why a volunteer could not start: no bootstrap peer answered, and what to check."""
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    peers = " ".join(initial_peers) or "(no --initial-peers given)"
    return (
        f"no bootstrap peer of job {job!r} answered at {peers} ({first}); is the job running and the "
        f"address current (it changes each time the job starts)? {JOB_MUST_RUN}"
    )
