"""The runtime's two ends of weight fan-out: the learner's `WeightFanout` (publish, then push down a
route) and a rollout worker's `RelayWeightSource` (read what was pushed, else pull from the learner).

The relay that moves the bytes between them is `transport.weights.relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from decentralized_verl.errors import WireError
from decentralized_verl.transport.weights.bulk_send import BULK_UNAVAILABLE
from decentralized_verl.transport.weights.publish import Published, WeightPublisher
from decentralized_verl.transport.weights.push import OK, REASON_CHARS
from decentralized_verl.transport.weights.receive import decode_held
from decentralized_verl.transport.weights.relay import WeightRelay
from decentralized_verl.transport.weights.route import Hop, plan_route

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

PUSH_FLOOR_S = 10.0
PUSH_MIN_BYTES_PER_S = 50e6
"""A push that has not reached the whole route by FLOOR + bytes / MIN_RATE is given up (every worker it
missed pulls instead): a worker that hangs alive (stopped, swapping) accepts the connection but not the
bytes, and must not hold the learner's step. Loopback and cluster networks move 1 GB/s or more."""


def push_deadline_s(total_bytes: int) -> float:
    return PUSH_FLOOR_S + total_bytes / PUSH_MIN_BYTES_PER_S


class WeightFanout:
    """The learner's side of weight sync with remote rollout workers.

    `publish` encodes a version into the learner's `WeightPublisher` (which its `Weights` service keeps
    serving, the pull path) and, with at least ``min_receivers`` rollout workers, pushes it down
    `plan_route` of them: the learner sends one copy, each worker verifies and forwards. A worker the push
    did not reach (down, restarting, an old build without the relay) is reported in `last_results` and
    pulls the version from the learner when it next needs it. The receiver list may change between
    versions (`add_receiver` / `remove_receiver`, e.g. rollout workers joining at run time).

    With ``bulk`` (the default) the bytes travel over the relays' bulk data plane (`bulk_plane`:
    gRPC for the signed manifest, raw TCP/TLS for the payload); the workers it reports as ``bulk
    unavailable`` (an older build, a closed port) are then pushed to over gRPC.
    """

    def __init__(
        self,
        publisher: WeightPublisher,
        addresses: Sequence[str] = (),
        *,
        min_receivers: int = 2,
        timeout_s: float = 300.0,
        grpc_options: Sequence[tuple[str, int]] = (),
        bulk: bool = True,
    ) -> None:
        if min_receivers < 1:
            raise ValueError(f"min_receivers: must be >= 1 (got {min_receivers})")
        self.relay = WeightRelay(publisher, timeout_s=timeout_s, grpc_options=grpc_options)
        self.addresses: list[str] = list(dict.fromkeys(addresses))
        self.min_receivers = min_receivers
        self.last_results: dict[str, str] = {}
        """address -> "ok" or why not, for the last push (empty when the last version was not pushed)."""
        self.pushes = 0
        self.bulk = bulk

    @property
    def publisher(self) -> WeightPublisher:
        return self.relay.publisher

    @property
    def pushing(self) -> bool:
        """Whether a new version is pushed (else every worker pulls, as with a single worker)."""
        return len(self.addresses) >= self.min_receivers

    def add_receiver(self, address: str) -> None:
        if address not in self.addresses:
            self.addresses.append(address)

    def remove_receiver(self, address: str) -> None:
        if address in self.addresses:
            self.addresses.remove(address)

    def route(self) -> tuple[Hop, ...]:
        return plan_route(self.addresses)

    async def publish(self, state_dict: Mapping[str, Tensor], version: int) -> dict[str, str]:
        """Encode and hold ``version`` (off the event loop), then push it when `pushing`; returns the
        push's per-worker outcome. A failed push never fails the publish: the workers pull instead."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.publisher.publish, state_dict, version)
        if not self.pushing:
            self.last_results = {}
            return {}
        return await self.push(version)

    async def push(self, version: int) -> dict[str, str]:
        route = self.route()
        held = self.publisher.get(version)
        deadline = push_deadline_s(held.manifest.total_bytes if held is not None else 0)
        try:
            if self.bulk:
                results = await self.relay.fan_out_bulk(version, route, timeout_s=deadline)
                results.update(await self._grpc_fallback(version, results, deadline))
            else:
                results = await self.relay.fan_out(version, route, timeout_s=deadline)
        except Exception as exc:  # a bug or a version gone: the pull path still serves every worker
            log.warning("weights v%d: push failed (%s); rollout workers will pull", version, exc)
            results = {a: f"not sent: {exc}"[:REASON_CHARS] for h in route for a in h.addresses()}
        self.pushes += 1
        self.last_results = results
        missed = {a: why for a, why in results.items() if why != OK}
        if missed:
            log.warning(
                "weights v%d: pushed to %d of %d workers; the others pull: %s",
                version,
                len(results) - len(missed),
                len(results),
                missed,
            )
        return results

    async def _grpc_fallback(self, version: int, results: dict[str, str], deadline: float) -> dict[str, str]:
        """A gRPC push to the workers the bulk plane could not reach as such (not to those that failed)."""
        unreachable = [a for a, why in results.items() if why.startswith(f"failed: {BULK_UNAVAILABLE}")]
        if not unreachable:
            return {}
        log.info("weights v%d: %d without the bulk plane; pushing over gRPC", version, len(unreachable))
        return await self.relay.fan_out(version, plan_route(unreachable), timeout_s=deadline)

    def publish_blocking(
        self, state_dict: Mapping[str, Tensor], version: int, loop: asyncio.AbstractEventLoop
    ) -> dict[str, str]:
        """`publish` from a thread other than ``loop``'s (the coordinator publishes from a worker thread)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("WeightFanout.publish_blocking would block its own event loop: await publish")
        return asyncio.run_coroutine_threadsafe(self.publish(state_dict, version), loop).result()

    async def close(self) -> None:
        await self.relay.close()


class RelayWeightSource:
    """A rollout worker's weights: what the learner pushed into its relay, else a pull from the learner.

    Blocking, for the worker's generation thread; ``loop`` is the event loop serving ``relay``.
    `fetch_latest(v)`: a held version >= v is decoded at once (it was verified on arrival). A push of such
    a version still arriving is waited for (up to ``wait_s``). Otherwise the learner's push may still be
    on its way down the chain, so it waits ``push_grace_s``, then catches up from ``learner`` (GetManifest
    + Fetch, every chunk verified), which also leaves the version in the relay for peers to Fetch.

    The grace is waited only while versions come by push: a worker the learner does not push to (the only
    rollout worker of a job: pushing starts at two, `WeightFanout.min_receivers`) pulled the version before
    and pulls the next at once, unless a push of it is arriving. Waiting there cost every step 0.5 s.
    """

    def __init__(
        self,
        relay: WeightRelay,
        learner: str,
        loop: asyncio.AbstractEventLoop,
        *,
        wait_s: float = 60.0,
        push_grace_s: float = 0.5,
    ) -> None:
        self.relay = relay
        self.learner = learner
        self.loop = loop
        self.wait_s = wait_s
        self.push_grace_s = push_grace_s
        self.pulls = 0
        """Versions this worker had to pull (the push missed it), for logs and tests."""
        self.pushed_last: bool | None = None
        """Whether the last version came by push (None before the first): the grace is for pushed workers."""

    def _held(self, min_version: int) -> Published | None:
        held = self.relay.publisher.get()
        return held if held is not None and held.manifest.version >= min_version else None

    def fetch_latest(self, min_version: int) -> tuple[int, dict[str, Tensor]]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError("RelayWeightSource.fetch_latest blocks: call it off the relay's event loop")
        start = time.monotonic()
        grace = 0.0 if self.pushed_last is False else self.push_grace_s
        while (held := self._held(min_version)) is None:
            waited = time.monotonic() - start
            arriving = any(v >= min_version for v in list(self.relay.receiving))
            if waited >= self.wait_s or (waited >= grace and not arriving):
                break
            self.relay.publisher.wait_for(min_version, 0.05)
        self.pushed_last = held is not None
        if held is None:
            self.pulls += 1
            left = max(self.wait_s - (time.monotonic() - start), 0.0)
            log.debug("weights: no pushed version >= %d; pulling from %s", min_version, self.learner)
            future = asyncio.run_coroutine_threadsafe(
                self.relay.catch_up(self.learner, min_version, wait_s=left, poll_s=0.2), self.loop
            )
            with contextlib.suppress(ValueError):  # a push landed a newer version meanwhile: it is held
                future.result()
            held = self._held(min_version)
            if held is None:
                raise WireError(
                    "weights.version", f"no version >= {min_version} after pulling from {self.learner}"
                )
        return held.manifest.version, decode_held(held)
