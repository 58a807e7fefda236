"""Hivemind DHT peers: the job's bootstrap peer (`dverl dht`) and the options every peer shares.

The bootstrap peer stores nothing of its own; it is the well-known address through which volunteers,
the coordinator and volunteer learners find each other. In a job it holds the identity issued with the
job's credentials (identity.py), so the learner can address it from `host:port`; otherwise its identity
is random (the quick start prints it, and others copy the `--initial-peers` line). With `--job` it checks
that every volunteer record was written by the peer it names (`signed_records`), as every peer of the
job does.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from decentralized_verl.errors import PeerUnavailable
from decentralized_verl.runtime.orphans import guard_descendants
from decentralized_verl.security.peer_identity import random_seed, write_identity
from decentralized_verl.security.trust import process_credentials

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
    identity_seed: bytes | None = field(default=None, repr=False)
    """This peer's identity (its key is derived from it, `identity.keypair`); None with `signed_job`: a
    random one. Held in memory so the peer can sign its own records."""
    signed_job: str | None = None
    """The job whose volunteer records this peer checks (and, holding its identity, signs)."""
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


def start_dht(options: PeerOptions, *, wait_timeout: float = 60.0, ready_timeout_s: float = 600.0):
    """Start a hivemind.DHT (its own process, which starts `p2pd`) and return it once it is running; a
    watchdog ends both should this process be killed without cleaning up (`orphans`). A process that dies
    before it serves, or serves nothing for `ready_timeout_s`, is an error (`_started`).

    With `signed_job` every record under that job's volunteer key must be signed by the peer it names,
    and this peer signs its own: its identity is then one this process holds (`identity_seed`, else a
    random one). The key file p2pd reads is removed once the peer has started."""
    import hivemind  # noqa: PLC0415 optional: hivemind (the volunteer extra), for a process that joins a DHT

    from decentralized_verl.volunteers.signed_records import OwnedRecords  # noqa: PLC0415 optional: signed_records imports hivemind (the volunteer extra)

    guard_descendants()
    seed = options.identity_seed
    if seed is None and options.signed_job is not None and options.identity_path is None:
        seed = random_seed()
    folder = None
    if seed is not None:
        folder = Path(tempfile.mkdtemp(prefix="dverl-id-"))
        options = dataclasses.replace(options, identity_path=str(write_identity(seed, folder)))
    validators = [OwnedRecords(options.signed_job, seed)] if options.signed_job is not None else []
    try:
        dht = hivemind.DHT(
            start=False, wait_timeout=wait_timeout, record_validators=validators, **options.dht_kwargs()
        )
        return _started(dht, ready_timeout_s)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _started(dht, ready_timeout_s: float):
    """Fork the DHT's process and return `dht` once it serves.

    The process is forked from this one, which runs gRPC threads (a learner's server and channels). Had the
    child inherited garbage and collected it, destroying gRPC objects whose threads stayed here would abort
    it, and its crash report can hang it for good (seen on a busy machine, the learner then waiting for it
    forever): everything alive at the fork is kept out of the child's collections. The wait ends with an
    error naming what happened when the process dies, or stays up without serving for `ready_timeout_s`
    (hivemind itself would wait forever)."""
    gc.collect()
    gc.freeze()
    try:
        dht.run_in_background(await_ready=False)
    finally:
        gc.unfreeze()
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            dht.wait_until_ready(timeout=1.0)
            return dht
        except TimeoutError:
            if not dht.is_alive():
                raise PeerUnavailable(
                    f"the DHT peer's process exited with code {dht.exitcode} before it served"
                ) from None
            if time.monotonic() > deadline:
                dht.terminate()
                raise PeerUnavailable(
                    f"the DHT peer's process did not serve within {ready_timeout_s:.0f}s; ended it"
                ) from None


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
    identity_seed: bytes | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run a bootstrap peer until SIGTERM/SIGINT (or `stop`); prints the banner with the peer id. Its
    identity is `identity_seed` (the job's, issued with its credentials), else random; with `job` it
    refuses volunteer records their owner did not sign."""
    options = PeerOptions(
        initial_peers=tuple(initial_peers),
        host_maddrs=tuple(host_maddrs) or (f"/ip4/0.0.0.0/tcp/{port}",),
        announce_maddrs=tuple(announce_maddrs),
        identity_seed=identity_seed,
        signed_job=job or None,
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


def main_dht(
    port: int,
    *,
    job: str | None,
    host_maddrs: Sequence[str],
    announce_maddrs: Sequence[str],
    initial_peers: Sequence[str],
) -> int:
    """`dverl dht`: a job's bootstrap peer holds the identity issued with the job's credentials (when this
    process was given them), any other a random one."""
    logging.basicConfig(level=logging.WARNING)
    credentials = process_credentials()
    return run_bootstrap(
        port,
        job=job,
        host_maddrs=host_maddrs,
        announce_maddrs=announce_maddrs,
        initial_peers=initial_peers,
        identity_seed=credentials.dht_seed if credentials is not None else None,
    )
