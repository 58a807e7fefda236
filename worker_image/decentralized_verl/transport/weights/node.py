"""What the working parts of a fan-out node use of the node itself.

A `relay.WeightRelay` is the node: the versions it holds, its channels, its hashing threads. Its parts
work for it (`push` sends a version down a route, `bulk_plane` receives and sends over the bulk plane,
`relay_service` answers its Weights service) and are given it as a `RelayNode`, a protocol declared here,
below all of them, so no part imports the relay that is built from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import grpc

    from decentralized_verl.transport import messages as m
    from decentralized_verl.transport.weights.chunk_verify import ChunkVerifier
    from decentralized_verl.transport.weights.publish import Published, WeightPublisher


class RelayNode(Protocol):
    """A fan-out node as its parts see it (`relay.WeightRelay` is the one implementation)."""

    publisher: WeightPublisher
    """The versions the node holds, served to a Fetch."""
    credentials: Any
    """What the node's channels and servers use (`transport.secure`)."""
    timeout_s: float
    verifier: ChunkVerifier
    """The hashing threads every way in checks chunks on."""
    pushes_received: int

    def channel(self, address: str) -> grpc.aio.Channel:
        """The node's channel to a peer, opened once."""
        ...

    async def admit(self, manifest: m.WeightManifest) -> None:
        """Raise `WireError` unless a pushed version may be taken; run before any chunk is received."""
        ...

    def wire(self, held: Published) -> tuple[bytes, ...]:
        """The serialized messages of a held version, built once."""
        ...

    def hold(self, published: Published, raws: Sequence[bytes]) -> None:
        """Hold a verified version."""
        ...

    def started_receiving(self, version: int) -> None: ...

    def done_receiving(self, version: int) -> None: ...
