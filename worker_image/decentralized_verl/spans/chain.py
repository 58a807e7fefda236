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
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import torch
from torch import Tensor

from decentralized_verl.errors import DverlError, WireError
from decentralized_verl.spans.client import SpanCalls, SpanClient, SpanFailure
from decentralized_verl.spans.codec import HopRequest
from decentralized_verl.spans.layout import Span
from decentralized_verl.spans.signed import SpanManifest
from decentralized_verl.transport.weights.codec import encode_state_dict

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
    checks: int = 0
    """Hops of an untrusted replica recomputed by a trusted one."""
    dropped: list[str] = field(default_factory=list)
    """Untrusted replicas caught returning wrong activations (never used again by this chain)."""


@dataclass
class _Route:
    span: Span
    clients: list[SpanCalls]
    current: int = 0
    stats: HopStats = field(default_factory=HopStats)

    @property
    def client(self) -> SpanCalls:
        return self.clients[self.current]

    def drop(self, client: SpanCalls, trusted: SpanCalls) -> None:
        """Never use `client` again; the route goes on on `trusted`."""
        self.clients.remove(client)
        self.current = self.clients.index(trusted)
        self.stats.dropped.append(client.address)


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
        check_fraction: float = 0.25,
        check_tolerance: float = 1e-3,
        token_tolerance: float | None = 0.05,
        seed: int | None = None,
    ) -> None:
        """`replicas`: per span, addresses of the job's span servers or ready clients (`SpanCalls`, e.g. a
        volunteer's `P2PSpanClient`). An untrusted client's hops are recomputed by a trusted replica of
        its span with probability `check_fraction` (drawn from the OS's randomness unless `seed` is given,
        so a volunteer cannot tell which hops are checked); a hop whose output differs by more than
        `check_tolerance` (relative to the largest activation) drops that client.

        An elementwise tolerance alone lets a volunteer steer: a perturbation inside it, aimed along the
        direction that raises a chosen token's logit, moves that token from p~0 to p~1 on a real model.
        So a checked hop is also judged by what it leads to: both outputs are carried through the rest
        of the chain on trusted replicas and the front's head (`head`, set by the front), and a hop whose
        next-token distributions differ by more than `token_tolerance` in total variation (the most
        probability a sampler could be moved by) drops the client too. None turns that off."""
        if not 0.0 <= check_fraction <= 1.0:
            raise ValueError(f"check_fraction: must be in [0, 1] (got {check_fraction})")
        if len(spans) != len(replicas):
            raise ValueError(f"replicas: {len(replicas)} address lists for {len(spans)} spans")
        for i, addresses in enumerate(replicas):
            if not addresses:
                raise ValueError(f"replicas[{i}]: span {spans[i]} needs at least one server address")
        self.routes = [
            _Route(
                span,
                [
                    SpanClient(a, timeout_s=timeout_s, credentials=credentials) if isinstance(a, str) else a
                    for a in addresses
                ],
            )
            for span, addresses in zip(spans, replicas, strict=True)
        ]
        for i, route in enumerate(self.routes):
            if check_fraction > 0 and not any(c.trusted for c in route.clients):
                raise ValueError(
                    f"replicas[{i}]: span {route.span} has only untrusted servers; "
                    "a trusted one must check them"
                )
        self.check_fraction = check_fraction
        self.check_tolerance = check_tolerance
        self.token_tolerance = token_tolerance
        self.head: Callable[[Tensor], Tensor] | None = None
        """The front's final norm and LM head (last hidden states -> logits), for the token check."""
        self.rng = random.Random(seed) if seed is not None else random.SystemRandom()
        self.hidden_size = hidden_size
        self.failover_s = failover_s
        self.version = version
        self.parts: list[Mapping[str, Tensor]] | None = None
        self.manifests: list[SpanManifest | None] = [None] * len(self.routes)
        self.on_drop: Callable[[SpanCalls, str], None] | None = None
        """Told of every untrusted replica dropped for wrong activations (a front reports it on)."""
        self.on_lost: Callable[[SpanCalls, str], None] | None = None
        """Told of every untrusted replica dropped because it stopped answering (not a cheat: it may be
        attached again when it comes back)."""

    def session(self, capacity: int) -> ChainSession:
        return ChainSession(self, capacity)

    # ------------------------------------------------------------ failover

    def replace(self, index: int, failed: SpanCalls, why: SpanFailure) -> None:
        """Move span `index` to its next replica (after `failed`); every session follows on its next hop."""
        route = self.routes[index]
        route.stats.failovers += 1
        trusted = next((c for c in route.clients if c.trusted and c is not failed), None)
        if not failed.trusted and failed in route.clients and trusted is not None:
            # A volunteer that stops answering is not waited for: the span goes on on a trusted replica,
            # and the front's coordinator hears of it (its slot, not a block).
            route.drop(failed, trusted)
            log.warning("span %s: volunteer %s lost (%s); going on with %s", route.span, failed.address, why,
                        trusted.address)  # fmt: skip
            if self.on_lost is not None:
                self.on_lost(failed, f"span {route.span}: {why}")
            return
        if route.client is failed:
            route.current = (route.current + 1) % len(route.clients)
        log.warning("span %s: %s; trying %s", route.span, why, route.client.address)

    def attach(self, index: int, client: SpanCalls) -> None:
        """Add a replica (a volunteer that joined) to span `index`; it takes the span's hops from the next
        one on, each session replaying its prefix into it, as after a failover. The caller holds the
        backend's lock (no hop or refresh in flight) and has brought it to this chain's version."""
        route = self.routes[index]
        if not client.trusted and self.check_fraction > 0 and not any(c.trusted for c in route.clients):
            raise ValueError(f"span {route.span}: no trusted replica to check an untrusted one against")
        route.clients.append(client)
        route.current = len(route.clients) - 1

    def bring_up_to_date(self, index: int, client: SpanCalls) -> None:
        """Give a replica that holds another version this chain's parts for its span."""
        if self.parts is None:
            raise ChainBroken(
                f"span {self.routes[index].span} at {client.address} holds another policy version and the "
                f"front has no weights of version {self.version} to give it"
            )
        _push(client, self.parts[index], self.version, self.manifests[index])

    # ------------------------------------------------------------ weights

    def load_weights(
        self,
        parts: Sequence[Mapping[str, Tensor]],
        version: int,
        manifests: Sequence[SpanManifest | None] | None = None,
    ) -> None:
        """Stage every span's tensors on every reachable replica, then commit `version` on them with the
        span's signed manifest. A span with no replica up (one restarting) is waited for, up to
        `failover_s`, as a hop would be."""
        if len(parts) != len(self.routes):
            raise ValueError(f"weights: {len(parts)} parts for {len(self.routes)} spans")
        manifests = list(manifests) if manifests is not None else [None] * len(parts)
        staged = [
            self._stage_span(route, part, version) for route, part in zip(self.routes, parts, strict=True)
        ]
        for route, reached, manifest in zip(self.routes, staged, manifests, strict=True):
            for client in reached:
                try:
                    client.commit(version, manifest)
                except SpanFailure as exc:
                    if exc.code == grpc.StatusCode.INVALID_ARGUMENT:  # refused, not unreachable
                        raise WireError(f"spans[{route.span}].commit", str(exc)) from None
                    log.warning(
                        "span %s: %s did not commit version %d (%s)", route.span, client.address, version, exc
                    )
        self.parts = list(parts)
        self.manifests = manifests
        self.version = version

    def _stage_span(self, route: _Route, part: Mapping[str, Tensor], version: int) -> list[SpanCalls]:
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


def _stage(client: SpanCalls, part: Mapping[str, Tensor], version: int) -> None:
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
    bundle = encode_state_dict(tensors, version, dtype=None, chunk_bytes=1 << 40)
    return b"".join(chunk.data for chunk in bundle.chunks)


def _push(client: SpanCalls, part: Mapping[str, Tensor], version: int, manifest: SpanManifest | None) -> None:
    _stage(client, part, version)
    client.commit(version, manifest)


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
        self.opened: list[SpanCalls | None] = [None] * len(chain.routes)
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
                if not client.trusted and self.chain.rng.random() < self.chain.check_fraction:
                    out = self._spot_check(index, client, hidden, attention, positions, out)
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
            if client in route.clients:  # a dropped one's last hop was the trusted replica's
                client.hops_served += 1
            route.stats.seconds += time.perf_counter() - began
            return out

    def _spot_check(
        self, index: int, client: SpanCalls, hidden: Tensor, attention: Tensor, positions: Tensor, out: Tensor
    ) -> Tensor:
        """Recompute an untrusted hop on a trusted replica (the session's prefix replayed in one pass under
        a new id) and compare. On a match the check session is freed; on a mismatch the untrusted server
        is dropped and the session goes on from the trusted replica, which already holds it."""
        route = self.chain.routes[index]
        trusted = next((c for c in route.clients if c.trusted), None)
        if trusted is None:
            return out
        name = f"{self.id}.check{next(_ids)}"
        request = self._replay_request(index, name, hidden, attention, positions)
        try:
            reference = trusted.forward(request, self.chain.hidden_size)
        except SpanFailure as exc:  # the check is a sample: a hop it could not check goes on unchecked
            log.warning(
                "span %s: could not check %s on %s (%s)", route.span, client.address, trusted.address, exc
            )
            return out
        route.stats.checks += 1
        scale = max(1.0, float(reference.abs().max()))
        off = (
            float((out.float() - reference.float()).abs().max()) / scale
            if out.shape == reference.shape
            else float("inf")
        )
        problem = None
        if off > self.chain.check_tolerance:
            problem = f"activations off by {off:.3g} (tolerance {self.chain.check_tolerance:.3g})"
        else:
            moved = self._token_shift(index, out, reference, attention, positions)
            if moved is not None and moved > (self.chain.token_tolerance or 0.0):
                problem = (
                    f"activations within {self.chain.check_tolerance:.3g} that move the next-token "
                    f"distribution by {moved:.3g} "
                    f"(total variation; tolerance {self.chain.token_tolerance:.3g})"
                )
        if problem is None:
            with contextlib.suppress(DverlError):
                trusted.close(name)
            return out
        log.warning("span %s: untrusted %s returned %s: dropped", route.span, client.address, problem)
        with contextlib.suppress(DverlError):
            client.close(self.names[index])
        route.drop(client, trusted)
        if self.chain.on_drop is not None:
            self.chain.on_drop(client, f"span {route.span}: {problem}")
        self.names[index], self.opened[index] = name, trusted
        return reference

    def _token_shift(
        self, index: int, out: Tensor, reference: Tensor, attention: Tensor, positions: Tensor
    ) -> float | None:
        """The largest total-variation distance, over the rows, between the next-token distributions the
        untrusted and the trusted output of span `index` lead to (the rest of the chain on trusted
        replicas, under check sessions of their own); None when it cannot be told (no head, a downstream
        span without a trusted replica or one that fails: the check is a sample)."""
        if self.chain.token_tolerance is None or self.chain.head is None:
            return None
        finals = []
        for candidate in (out, reference):
            hidden = candidate
            for later in range(index + 1, len(self.chain.routes)):
                trusted = next((c for c in self.chain.routes[later].clients if c.trusted), None)
                if trusted is None:
                    return None
                name = f"{self.id}.follow{next(_ids)}"
                request = self._replay_request(later, name, hidden, attention, positions)
                try:
                    hidden = trusted.forward(request, self.chain.hidden_size)
                except SpanFailure:
                    return None
                finally:
                    with contextlib.suppress(DverlError):
                        trusted.close(name)
            finals.append(hidden[:, -1:, :])
        with torch.no_grad():
            p, q = (torch.softmax(self.chain.head(h).float(), dim=-1) for h in finals)
        return float(0.5 * (p - q).abs().sum(dim=-1).max())

    def _replay_request(
        self, index: int, session: str, hidden: Tensor, attention: Tensor, positions: Tensor
    ) -> HopRequest:
        """Open `session` with all span `index` has seen plus this hop, answering this hop's columns."""
        prefix = self.history[index]
        full = torch.cat([*prefix, hidden], dim=1) if prefix else hidden
        all_positions = torch.cat([*self.positions, positions], dim=1) if prefix else positions
        replayed = int(full.shape[1] - hidden.shape[1])
        return HopRequest(
            session,
            self.chain.version,
            full,
            attention,
            all_positions,
            open=True,
            capacity=self.capacity,
            keep_last=int(hidden.shape[1]) if replayed else 0,
        )

    def _send(
        self,
        index: int,
        client: SpanCalls,
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
        request = self._replay_request(index, session, hidden, attention, positions)
        out = client.forward(request, size)
        self.opened[index] = client
        self.chain.routes[index].stats.replayed_tokens += int(request.hidden.shape[1] - hidden.shape[1])
        return out

    def close(self) -> None:
        """Free the session on every server that holds it (best effort: a dead one frees nothing)."""
        for index, client in enumerate(self.opened):
            if client is not None:
                with contextlib.suppress(DverlError):
                    client.close(self.names[index])
                self.opened[index] = None
