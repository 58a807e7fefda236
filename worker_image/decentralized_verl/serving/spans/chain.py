"""A session through the whole chain of spans, as the front sees it, and the failover that keeps it going.

The front talks to every span in turn (a star, as in Petals: hidden states come back to the front after
each hop), so it holds, per session and span, every hidden state it has sent into that span. When a span
server dies, hangs past the deadline, restarts or refuses the version, the session moves to the next
replica of that span (or the same address again, once it is back): the new server gets a session opened
with the whole prefix replayed in one pass, returns the newest columns, and the hop goes on. No token is
sampled until every span has answered, so a failed hop is retried, never half-applied: nothing is lost
or produced twice.

Weights: a refresh stages each span's tensors on every reachable replica, then commits the version on
each. The chain keeps (by reference) the parts of the version it holds, so a replica that missed the
refresh (it was down, or it is new) is brought up to date before it takes over a session.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from decentralized_verl.errors import DverlError
from decentralized_verl.serving.spans.client import SpanClient, SpanFailure
from decentralized_verl.serving.spans.codec import HopRequest
from decentralized_verl.serving.spans.layout import Span

log = logging.getLogger(__name__)

STAGE_BYTES = 32 * 1024 * 1024
"""Largest weight blob in one Stage call (below gRPC's 64 MiB message limit)."""


class ChainBroken(DverlError):
    """No replica of a span could serve the session within the failover budget."""


@dataclass
class HopStats:
    """Per-span counters the benchmark and the tests read."""

    hops: int = 0
    seconds: float = 0.0
    failovers: int = 0
    replayed_tokens: int = 0


@dataclass
class _Route:
    span: Span
    clients: list[SpanClient]
    current: int = 0
    stats: HopStats = field(default_factory=HopStats)

    @property
    def client(self) -> SpanClient:
        return self.clients[self.current]


class Chain:
    """The spans of one model, each served by one or more replicas (addresses), in layer order."""

    def __init__(
        self,
        spans: Sequence[Span],
        replicas: Sequence[Sequence[str]],
        hidden_size: int,
        *,
        timeout_s: float = 60.0,
        failover_s: float = 120.0,
        version: int = 0,
        credentials: object = None,
    ) -> None:
        if len(spans) != len(replicas):
            raise ValueError(f"replicas: {len(replicas)} address lists for {len(spans)} spans")
        for i, addresses in enumerate(replicas):
            if not addresses:
                raise ValueError(f"replicas[{i}]: span {spans[i]} needs at least one server address")
        self.routes = [
            _Route(span, [SpanClient(a, timeout_s=timeout_s, credentials=credentials) for a in addresses])
            for span, addresses in zip(spans, replicas, strict=True)
        ]
        self.hidden_size = hidden_size
        self.failover_s = failover_s
        self.version = version
        self.parts: list[Mapping[str, Tensor]] | None = None

    def session(self, capacity: int) -> ChainSession:
        return ChainSession(self, capacity)

    # ------------------------------------------------------------ failover

    def replace(self, index: int, failed: SpanClient, why: SpanFailure) -> None:
        """Move span `index` to its next replica (after `failed`); every session follows on its next hop."""
        route = self.routes[index]
        route.stats.failovers += 1
        if route.client is failed:
            route.current = (route.current + 1) % len(route.clients)
        log.warning("span %s: %s; trying %s", route.span, why, route.client.address)

    def bring_up_to_date(self, index: int, client: SpanClient) -> None:
        """Give a replica that holds another version this chain's parts for its span."""
        if self.parts is None:
            raise ChainBroken(
                f"span {self.routes[index].span} at {client.address} holds another policy version and the "
                f"front has no weights of version {self.version} to give it"
            )
        _push(client, self.parts[index], self.version)

    # ------------------------------------------------------------ weights

    def load_weights(self, parts: Sequence[Mapping[str, Tensor]], version: int) -> None:
        """Stage every span's tensors on every reachable replica, then commit `version` on them. A span
        with no replica up (one restarting) is waited for, up to `failover_s`, as a hop would be."""
        if len(parts) != len(self.routes):
            raise ValueError(f"weights: {len(parts)} parts for {len(self.routes)} spans")
        staged = [
            self._stage_span(route, part, version) for route, part in zip(self.routes, parts, strict=True)
        ]
        for route, reached in zip(self.routes, staged, strict=True):
            for client in reached:
                try:
                    client.commit(version)
                except SpanFailure as exc:
                    log.warning(
                        "span %s: %s did not commit version %d (%s)", route.span, client.address, version, exc
                    )
        self.parts = list(parts)
        self.version = version

    def _stage_span(self, route: _Route, part: Mapping[str, Tensor], version: int) -> list[SpanClient]:
        deadline = time.monotonic() + self.failover_s
        while True:
            reached = []
            for client in route.clients:
                try:
                    _stage(client, part, version)
                    reached.append(client)
                except SpanFailure as exc:
                    log.warning(
                        "span %s: %s missed the refresh to version %d (%s)",
                        route.span,
                        client.address,
                        version,
                        exc,
                    )
            if reached:
                return reached
            if time.monotonic() > deadline:
                raise ChainBroken(
                    f"span {route.span}: no replica reachable for the refresh to version {version}"
                )
            time.sleep(1.0)

    def close(self) -> None:
        for route in self.routes:
            for client in route.clients:
                client.shutdown()


def _stage(client: SpanClient, part: Mapping[str, Tensor], version: int) -> None:
    group: dict[str, Tensor] = {}
    size = 0
    items = list(part.items())
    for name, tensor in items:
        group[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= STAGE_BYTES:
            client.stage(_blob(group, version))
            group, size = {}, 0
    if group or not items:
        client.stage(_blob(group, version))


def _blob(tensors: Mapping[str, Tensor], version: int) -> bytes:
    from decentralized_verl.transport.weights.codec import encode_state_dict

    bundle = encode_state_dict(tensors, version, dtype=None, chunk_bytes=1 << 40)
    return b"".join(chunk.data for chunk in bundle.chunks)


def _push(client: SpanClient, part: Mapping[str, Tensor], version: int) -> None:
    _stage(client, part, version)
    client.commit(version)


_ids = itertools.count()


class ChainSession:
    """One micro-batch's pass through the chain; the decode loop uses it where a model takes its cache.

    `batch_select_indices` (copy a prompt's row to its group, drop finished rows) is remembered and sent
    with the next hop; the front's per-span history is reselected the same way, so a replay rebuilds
    exactly the rows the session holds.
    """

    def __init__(self, chain: Chain, capacity: int) -> None:
        self.chain = chain
        self.capacity = capacity
        self.id = f"{uuid.uuid4().hex[:12]}-{next(_ids)}"
        self.history: list[list[Tensor]] = [[] for _ in chain.routes]
        self.positions: list[Tensor] = []
        self.opened: list[SpanClient | None] = [None] * len(chain.routes)
        self.names = [self.id] * len(chain.routes)
        """The session's id on each span: a new one after a failure, since a server that was only slow
        may still hold (or go on to finish) the old one, which then expires unused."""
        self.rows: Tensor | None = None

    def batch_select_indices(self, index: Tensor) -> None:
        index = index.to(torch.long).cpu()
        self.rows = index if self.rows is None else self.rows.index_select(0, index)

    def get_seq_length(self) -> int:
        return sum(int(p.shape[1]) for p in self.positions)

    def forward(self, hidden: Tensor, attention: Tensor, positions: Tensor) -> Tensor:
        """Run `hidden` ([B, T, H]) through every span; the last span's output."""
        rows = self.rows
        self.rows = None
        if rows is not None:
            self.history = [[h.index_select(0, rows) for h in chunks] for chunks in self.history]
            self.positions = [p.index_select(0, rows) for p in self.positions]
        attention, positions = attention.cpu(), positions.cpu()
        for index in range(len(self.chain.routes)):
            inputs = hidden
            hidden = self._hop(index, inputs, attention, positions, rows)
            self.history[index].append(inputs)
        self.positions.append(positions)
        return hidden

    def _hop(
        self, index: int, hidden: Tensor, attention: Tensor, positions: Tensor, rows: Tensor | None
    ) -> Tensor:
        route = self.chain.routes[index]
        deadline = time.monotonic() + self.chain.failover_s
        while True:
            client = route.client
            began = time.perf_counter()
            try:
                out = self._send(index, client, hidden, attention, positions, rows)
            except SpanFailure as exc:
                self.opened[index] = None
                self.names[index] = f"{self.id}.{next(_ids)}"
                if time.monotonic() > deadline:
                    raise ChainBroken(
                        f"span {route.span}: no replica answered within {self.chain.failover_s:.0f}s ({exc})"
                    ) from exc
                if exc.code.name == "FAILED_PRECONDITION":
                    try:
                        self.chain.bring_up_to_date(index, client)
                        continue
                    except SpanFailure as push_failed:
                        exc = push_failed
                self.chain.replace(index, client, exc)
                time.sleep(0.2 if len(route.clients) > 1 else 1.0)  # a lone server: wait for its restart
                continue
            route.stats.hops += 1
            route.stats.seconds += time.perf_counter() - began
            return out

    def _send(
        self,
        index: int,
        client: SpanClient,
        hidden: Tensor,
        attention: Tensor,
        positions: Tensor,
        rows: Tensor | None,
    ) -> Tensor:
        version, session, size = self.chain.version, self.names[index], self.chain.hidden_size
        if self.opened[index] is client:
            request = HopRequest(
                session,
                version,
                hidden,
                attention,
                positions,
                rows=None if rows is None else tuple(rows.tolist()),
            )
            return client.forward(request, size)
        # A session new to this server: open it with everything the span has seen (none on the first hop).
        prefix = self.history[index]
        full = torch.cat([*prefix, hidden], dim=1) if prefix else hidden
        all_positions = torch.cat([*self.positions, positions], dim=1) if prefix else positions
        replayed = int(full.shape[1] - hidden.shape[1])
        request = HopRequest(
            session,
            version,
            full,
            attention,
            all_positions,
            open=True,
            capacity=self.capacity,
            keep_last=int(hidden.shape[1]) if replayed else 0,
        )
        out = client.forward(request, size)
        self.opened[index] = client
        self.chain.routes[index].stats.replayed_tokens += replayed
        return out

    def close(self) -> None:
        """Free the session on every server that holds it (best effort: a dead one frees nothing)."""
        for index, client in enumerate(self.opened):
            if client is not None:
                with contextlib.suppress(DverlError):
                    client.close(self.names[index])
                self.opened[index] = None
