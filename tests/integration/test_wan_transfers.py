"""Weights to volunteers over real Hivemind P2P: deltas against the version a volunteer holds, full bundles
when there is no chain, and transfers that resume from the last verified piece or chunk after a drop.

In-process: two real DHT peers; the coordinator's handlers on one, the volunteer's source on the other.
Versions come from real Adam steps; every received version is compared with the learner's own bytes.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from decentralized_verl.errors import WireError
from decentralized_verl.transport.delta_p2p import DeltaEndpoint, DeltaP2PWeightSource, cut
from decentralized_verl.transport.p2p import CoordinatorEndpoints
from decentralized_verl.transport.weights.delta_publish import DeltaPublisher
from tests.support.weight_states import trained_states

pytestmark = pytest.mark.usefixtures("collected_before_fork")


class DroppingDelta(DeltaEndpoint):
    """Drops its first stream after two pieces (a connection cut mid-transfer)."""

    drops = 1

    async def _delta(self, request, context):
        sent = 0
        async for msg in super()._delta(request, context):
            if self.drops and sent == 3:  # the header and two pieces went through
                self.drops -= 1
                raise ConnectionResetError("link dropped")
            sent += 1
            yield msg


class TamperingDelta(DeltaEndpoint):
    """Serves a chain whose pieces match their own digests but rebuild the wrong weights (a forged delta)."""

    async def _delta(self, request, context):
        from google.protobuf import wrappers_pb2

        ask = json.loads(request.value)
        frames = self.publisher.chain(int(ask["base"]), int(ask["version"]))
        forged = [f[:-64] + bytes(b ^ 0xFF for b in f[-64:]) for f in frames]
        header, pieces = cut(forged, self.piece_bytes)
        yield wrappers_pb2.BytesValue(value=json.dumps(header).encode())
        for piece in pieces:
            yield wrappers_pb2.BytesValue(value=piece)


async def _serve(two_peers, endpoint_type, admitted=lambda _: True, **publisher_kw):
    server, caller = two_peers
    serve_p2p, call_p2p = await server.replicate_p2p(), await caller.replicate_p2p()
    publisher = DeltaPublisher(dtype="bfloat16", chunk_bytes=8192, signing_key=None, **publisher_kw)
    await CoordinatorEndpoints(
        serve_p2p, admit=None, is_admitted=admitted, publisher=publisher, spec_json="{}"
    ).register()
    endpoint = endpoint_type(serve_p2p, publisher, admitted, piece_bytes=1024)
    await endpoint.register()
    source = DeltaP2PWeightSource(
        call_p2p,
        server.peer_id.to_base58(),
        asyncio.get_running_loop(),
        wait_s=5,
        timeout_s=30,
        verify_key=None,
    )
    return publisher, endpoint, source


def _same(got: dict, state: dict) -> bool:
    return all(torch.equal(got[k], state[k].to(torch.bfloat16)) for k in state)


async def test_a_volunteer_gets_deltas_and_resumes_a_dropped_one(two_peers) -> None:
    states = trained_states(lr=1e-5, steps=12)
    publisher, _, source = await _serve(two_peers, DroppingDelta, max_chain=3)
    try:
        publisher.publish(states[0], 0)
        version, got = await asyncio.to_thread(source.fetch_latest, 0)
        assert version == 0 and _same(got, states[0]) and source.full_fetches == 1
        full = source.full_bytes

        publisher.publish(states[1], 1)
        publisher.publish(states[2], 2)  # the volunteer skipped v1: a chain of two deltas
        version, got = await asyncio.to_thread(source.fetch_latest, 1)
        assert version == 2 and _same(got, states[2])
        assert source.deltas_used == 1 and source.full_fetches == 1
        assert source.delta_calls == [(0, 2, 0), (0, 2, 2)]  # dropped after two pieces, resumed at the third
        assert source.delta_bytes == sum(len(f) for f in publisher.chain(0, 2))  # no piece received twice
        assert source.delta_bytes * 3 < full

        for v in range(3, 8):  # five versions behind, the chain is longer than max_chain: a full bundle
            publisher.publish(states[v], v)
        version, got = await asyncio.to_thread(source.fetch_latest, 7)
        assert version == 7 and _same(got, states[7]) and source.full_fetches == 2 and source.deltas_used == 1
    finally:
        publisher.close()


async def test_a_forged_delta_is_refused_and_the_full_bundle_fetched(two_peers) -> None:
    states = trained_states(lr=1e-5, steps=2)
    publisher, _, source = await _serve(two_peers, TamperingDelta)
    try:
        publisher.publish(states[0], 0)
        await asyncio.to_thread(source.fetch_latest, 0)
        publisher.publish(states[1], 1)
        version, got = await asyncio.to_thread(source.fetch_latest, 1)
        assert version == 1 and _same(got, states[1])  # the manifest caught the forgery; nothing wrong held
        assert source.deltas_used == 0 and source.full_fetches == 2 and source.delta_calls == [(0, 1, 0)]
    finally:
        publisher.close()


async def test_a_peer_that_did_not_join_gets_neither_deltas_nor_bundles(two_peers) -> None:
    states = trained_states(lr=1e-5, steps=1)
    publisher, _, source = await _serve(two_peers, DeltaEndpoint, admitted=lambda _: False)
    try:
        publisher.publish(states[0], 0)
        with pytest.raises(WireError, match="has not joined"):
            await asyncio.to_thread(source.fetch_latest, 0)
    finally:
        publisher.close()


async def test_a_volunteer_prefetches_each_new_version_ahead_of_work(two_peers) -> None:
    from decentralized_verl.volunteers.prefetch import WeightPrefetch

    states = trained_states(lr=1e-5, steps=3)
    publisher, _, source = await _serve(two_peers, DeltaEndpoint)

    class Holder:
        """What prefetch uses of a RolloutWorker: the version held, and pulling a newer one."""

        version = -1

        def ensure_version(self, version: int) -> int:
            self.version, self.state = source.fetch_latest(version)
            return self.version

    holder = Holder()
    prefetch = WeightPrefetch(source, holder, poll_s=0.05)
    try:
        assert not await prefetch.once()  # nothing published yet
        publisher.publish(states[0], 0)
        assert await prefetch.once() and holder.version == 0
        assert not await prefetch.once()  # already held: no pull
        publisher.publish(states[1], 1)
        assert await prefetch.once() and holder.version == 1 and source.deltas_used == 1
        prefetch.start()
        publisher.publish(states[2], 2)
        for _ in range(400):
            if holder.version == 2:
                break
            await asyncio.sleep(0.05)
        assert holder.version == 2 and _same(holder.state, states[2]) and prefetch.prefetched == 3
    finally:
        await prefetch.stop()
        publisher.close()
