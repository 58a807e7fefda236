"""Weight fan-out learner -> N rollout workers without the learner sending N copies: a relay tree.

The learner sends one copy down a chain or tree of relays (rollout workers). A relay verifies chunk k
against the manifest, hands it to its children's Push streams and is already receiving chunk k+1, so a
version reaches every worker in about ``size / bandwidth + depth * chunk latency`` instead of
``N * size / bandwidth``.

The route travels with the data: the sender puts the subtree below each child in the Push call's
metadata (``dverl-fanout-route``), so relays need no configuration beyond their own address. Each
relay answers in its trailing metadata (``dverl-fanout-result``) with the outcome for every node of its
subtree, so the learner learns who holds the version.

Failure rules:
- every chunk is hash-checked (against the manifest) before it is forwarded, and the whole-bundle
  digest is checked before a relay holds the version; a bad chunk ends the push at that relay, and its
  children's streams are cancelled so they hold nothing partial;
- a child that cannot be reached, breaks, or rejects the data is skipped: its parent adopts the child's
  own children (replaying the chunks already sent), so one broken worker never cuts off the others.
  The skipped worker catches up later with `WeightRelay.catch_up` (a Fetch from its parent).

Speed: the runtime pushes over the bulk data plane (`bulk_plane`: BulkOpen carries the signed
manifest over gRPC, the bytes flow over TCP/TLS into one buffer, hashed per chunk and relayed from it);
the gRPC Push below is the fallback. There, messages travel as the serialized bytes they arrived in, each
chunk hashed exactly once (in a worker thread) and never re-encoded; a version encoded here (the learner's)
is held only as its one buffer, and each stream makes a chunk's message when it sends it.

Each concern has its module: the Weights service a relay answers (Push received, verified and passed on;
Fetch of held versions) is `transport.weights.relay_service`, the hashing threads every receive path shares
are `transport.weights.chunk_verify`, the pull from a parent is `transport.weights.catch_up` and the
sending half is `transport.weights.push`; `WeightRelay` itself is the node: what it holds and how it
reaches its peers. Those parts see it as a `transport.weights.node.RelayNode`, so none imports this module.

Routes are planned in `transport.weights.route`. In the runtime (`transport.weights.fanout`) the learner's
`WeightFanout` pushes each version down `plan_route` of its remote rollout workers; each serves a
`WeightRelay` on its own gRPC port and reads weights through `RelayWeightSource`, which falls back to
pulling from the learner. A relay's `WeightPublisher` serves GetManifest/Fetch like the learner's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.transport import messages as m
from decentralized_verl.transport import secure
from decentralized_verl.transport.weights.bulk_plane import BulkPlane
from decentralized_verl.transport.weights.catch_up import fetch_version, newest_manifest
from decentralized_verl.transport.weights.chunk_verify import ChunkVerifier
from decentralized_verl.transport.weights.publish import Published, WeightPublisher
from decentralized_verl.transport.weights.push import HeldMessages, Session
from decentralized_verl.transport.weights.relay_service import RelayServicer
from decentralized_verl.transport.weights.route import Hop
from decentralized_verl.transport.weights.version_admission import confirm_with_learner, follows_held

FANOUT_CHUNK_BYTES = 4 * 1024 * 1024
"""Chunk size worth using for fan-out: fewer, larger gRPC messages amortize per-message overhead."""


class WeightRelay:
    """A node of the weight fan-out: the learner (root) or a rollout worker (relay and leaf).

    It holds versions in `publisher` (serving GetManifest/Fetch like `WeightsServicer`), receives Push
    streams and forwards each verified chunk to the children named in the call's route. Use
    `add_to_server` on a grpc.aio server (instead of `WeightsServicer`) or `serve_relay`.
    """

    def __init__(
        self,
        publisher: WeightPublisher | None = None,
        *,
        timeout_s: float = 300.0,
        verify_threads: int = 2,
        grpc_options: Sequence[tuple[str, int]] = (),
        credentials: Any = secure.PROCESS,
        learner: str | None = None,
    ) -> None:
        self.publisher = publisher or WeightPublisher(chunk_bytes=FANOUT_CHUNK_BYTES)
        self.learner = learner
        """The learner's address: a pushed version is taken only while it publishes that version
        (`version_admission`); None (the learner itself, a test relay) takes any newer signed one."""
        self.credentials = credentials
        """What this node's channels and server use (default: this process's job credentials)."""
        self.timeout_s = timeout_s
        self.grpc_options = tuple(grpc_options)
        """Extra gRPC options for this node's channels and server, after the project's defaults."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._wire: dict[tuple[int, str], tuple[bytes, ...]] = {}
        self.verifier = ChunkVerifier(verify_threads)
        """The hashing threads every way in (Push, catch-up, bulk plane) checks chunks on."""
        self.pushes_received = 0
        self.bulk = BulkPlane(self)
        """The bulk data plane (`transport.weights.bulk_plane`): listening once `serve_relay` started it."""
        self.receiving: dict[int, int] = {}
        """version -> pushes of it arriving right now (a reader waits for them rather than pulling)."""
        self._service = RelayServicer(self)

    # ----------------------------------------------------------------- plumbing

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = secure.aio_channel(address, self.credentials, self.grpc_options)
        return self._channels[address]

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self.bulk.close()
        self.verifier.close()

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register this node's Weights service (`relay_service`) on ``server``."""
        self._service.add_to_server(server)

    async def admit(self, manifest: m.WeightManifest) -> None:
        """Raise WireError unless a pushed `manifest` follows what this node holds and is what the learner
        publishes now (`version_admission`); run before any chunk is received."""
        held = self.publisher.get(manifest.version)
        follows_held(manifest, self.publisher.latest_version, held.manifest.digest if held else None)
        if self.learner is not None and held is None:
            await confirm_with_learner(manifest, self.channel(self.learner), self.learner)

    # ----------------------------------------------------------------- holding

    def wire(self, held: Published) -> Sequence[bytes]:
        """The serialized messages of a held version: as received, when it came in as messages, else
        made one at a time as a stream reads them (a version encoded here is held once, as its buffer)."""
        raws = self._wire.get((held.manifest.version, held.manifest.digest))
        return raws if raws is not None else HeldMessages(held)

    def _remember(self, key: tuple[int, str], raws: tuple[bytes, ...]) -> None:
        self._wire[key] = raws
        held = set(self.publisher.versions)
        for old in [k for k in self._wire if k[0] not in held]:
            del self._wire[old]

    def publish(self, state_dict, version: int) -> m.WeightManifest:
        """Learner side: encode and hold a version; streams serialize its chunks as they send them."""
        return self.publisher.publish(state_dict, version)

    def hold(self, published: Published, raws: Sequence[bytes]) -> None:
        """Hold a verified version: where every way in (Push, bulk plane, catch-up) ends, so the node holds
        only what passed its checks. One already held with the same bytes is fine (caught up earlier). With
        no ``raws`` (a bulk transfer) the messages a Fetch serves are built when first asked for."""
        held = self.publisher.get(published.manifest.version)
        if held is not None and held.manifest.digest == published.manifest.digest:
            return
        self.publisher.store(published)
        if raws:
            self._remember((published.manifest.version, published.manifest.digest), tuple(raws))

    def started_receiving(self, version: int) -> None:
        """Count a push of ``version`` now arriving (a gRPC Push admitted, or a bulk transfer opened), so
        a reader waits for it rather than pulling; `done_receiving` ends it, whatever the outcome."""
        self.receiving[version] = self.receiving.get(version, 0) + 1

    def done_receiving(self, version: int) -> None:
        left = self.receiving.get(version, 0) - 1
        if left > 0:
            self.receiving[version] = left
        else:
            self.receiving.pop(version, None)

    # ----------------------------------------------------------------- sending

    async def fan_out(
        self, version: int | None, route: Sequence[Hop], *, timeout_s: float | None = None
    ) -> dict[str, str]:
        """Send a held version (the newest when None) down ``route``; returns address -> "ok" or why not,
        for every node of the route (a skipped node is reported, the nodes below it are still served). A
        child still busy after ``timeout_s`` is cut off with its subtree (they pull instead)."""
        held = self.publisher.get(version)
        if held is None:
            raise WireError(
                "weights.version", f"version {version} is not held (held: {self.publisher.versions})"
            )
        raws = self.wire(held)
        session = Session(self)
        for hop in route:
            session.open(hop)
        for index in range(len(raws)):  # each child's stream makes a message when it sends it
            session.send(partial(raws.__getitem__, index))
        return await session.finish(timeout_s)

    async def fan_out_bulk(
        self, version: int | None, route: Sequence[Hop], *, timeout_s: float | None = None
    ) -> dict[str, str]:
        """`fan_out` over the bulk data plane (`bulk_plane`): the same route, checks and outcomes;
        a node without a bulk plane is reported as ``bulk unavailable: ...``."""
        return await asyncio.to_thread(self.bulk.fan_out, version, route, timeout_s)

    # ----------------------------------------------------------------- catching up

    async def catch_up(
        self, parent: str, min_version: int = 0, *, wait_s: float = 0.0, poll_s: float = 0.1
    ) -> int:
        """Fetch the newest version (>= min_version) from ``parent`` and hold it; returns its version.

        For a node that was skipped by a fan-out, or any receiver in the plain pull mode (`catch_up`).
        """
        channel = self.channel(parent)
        manifest = await newest_manifest(
            channel, parent, min_version, timeout_s=self.timeout_s, wait_s=wait_s, poll_s=poll_s
        )
        held = self.publisher.get(manifest.version)
        if held is not None and held.manifest.digest == manifest.digest:
            return manifest.version
        published, raws = await fetch_version(
            channel, parent, manifest, timeout_s=self.timeout_s, verifier=self.verifier
        )
        self.hold(published, raws)
        return manifest.version


async def serve_relay(
    relay: WeightRelay,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    add: Iterable[Callable[[grpc.aio.Server], None]] = (),
    services: Iterable[str] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with ``relay``'s Weights service (and whatever each ``add`` registers, e.g. a
    rollout worker's own services, so the relay shares its port, named in ``services`` for the server's
    receive limit); its port is ``server.port``."""
    server = secure.aio_server(list(relay.grpc_options), relay.credentials, services=("Weights", *services))
    relay.add_to_server(server)
    for register in add:
        register(server)
    bound = secure.bind(server, host, port)
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.port = bound  # type: ignore[attr-defined]
    relay.bulk.listen(host)
    await server.start()
    return server
