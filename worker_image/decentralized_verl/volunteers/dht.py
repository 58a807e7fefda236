"""Hivemind DHT peers: the job's bootstrap peer (`dverl dht`) and the options every peer shares.

The bootstrap peer stores nothing of its own; it is the well-known address through which volunteers,
the coordinator and volunteer learners find each other. With `--job` its identity is derived from the
job name (identity.py) so the learner can address it from `host:port`; without, it is random (seed
000's quick start prints it, and others copy the `--initial-peers` line).
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BANNER_WIDTH = 60


@dataclass(frozen=True)
class PeerOptions:
    """How a peer reaches and is reached (NAT traversal included); maps onto hivemind.DHT's arguments."""

    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    client_mode: bool = False
    """A peer behind NAT that cannot accept connections: it reaches others, serves no DHT requests."""
    use_relay: bool = True
    use_auto_relay: bool = False
    """Ask public peers to relay inbound streams to a volunteer that cannot be reached directly."""
    identity_path: str | None = None
    extra: dict = field(default_factory=dict)

    def dht_kwargs(self) -> dict:
        kwargs = dict(
            initial_peers=list(self.initial_peers),
            host_maddrs=list(self.host_maddrs),
            client_mode=self.client_mode,
            use_relay=self.use_relay,
            use_auto_relay=self.use_auto_relay,
            **self.extra,
        )
        if self.announce_maddrs:
            kwargs["announce_maddrs"] = list(self.announce_maddrs)
        if self.identity_path is not None:
            kwargs["identity_path"] = self.identity_path
            kwargs["check_if_identity_free"] = False  # hivemind's check only understands RSA identities
        return kwargs


def start_dht(options: PeerOptions, *, wait_timeout: float = 60.0):
    """Start a hivemind.DHT (its own process, which starts `p2pd`) and return it once it is running; a
    watchdog ends both should this process be killed without cleaning up (`orphans`)."""
    import hivemind

    from decentralized_verl.runtime.orphans import guard_descendants

    guard_descendants()
    return hivemind.DHT(start=True, await_ready=True, wait_timeout=wait_timeout, **options.dht_kwargs())


def pick_initial_peers_line(maddrs: Sequence[object]) -> str:
    """The address to print: a routable one when the peer listens on several, else loopback."""
    texts = [str(a) for a in maddrs]
    public = [a for a in texts if not a.startswith(("/ip4/127.", "/ip6/::1"))]
    return (public or texts or ["<no address>"])[0]


def banner(peer_id: str, maddrs: Sequence[object], job: str | None) -> str:
    line = "=" * BANNER_WIDTH
    lines = [
        "Decentralized veRL DHT Bootstrap Node",
        line,
        f"Node ID: bootstrap{'' if job is None else f' (job {job})'}",
        f"Peer ID: {peer_id}",
        "",
        "Connect other nodes with:",
        f"  --initial-peers {pick_initial_peers_line(maddrs)}",
    ]
    others = [str(a) for a in maddrs][1:]
    if others:
        lines.append("All addresses: " + " ".join(str(a) for a in maddrs))
    lines.append(line)
    return "\n".join(lines)


def run_bootstrap(
    port: int,
    *,
    job: str | None = None,
    host_maddrs: Sequence[str] = (),
    announce_maddrs: Sequence[str] = (),
    initial_peers: Sequence[str] = (),
    identity_dir: Path | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run a bootstrap peer until SIGTERM/SIGINT (or `stop`); prints the banner with the peer id."""
    from decentralized_verl.volunteers.identity import bootstrap_seed, write_identity

    identity = None
    if job:
        folder = identity_dir or Path(tempfile.mkdtemp(prefix="dverl-dht-"))
        identity = str(write_identity(bootstrap_seed(job), folder))
    options = PeerOptions(
        initial_peers=tuple(initial_peers),
        host_maddrs=tuple(host_maddrs) or (f"/ip4/0.0.0.0/tcp/{port}",),
        announce_maddrs=tuple(announce_maddrs),
        identity_path=identity,
    )
    dht = start_dht(options)
    try:
        print(banner(str(dht.peer_id), dht.get_visible_maddrs(), job), flush=True)
        stop = stop or threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        dht.shutdown()
