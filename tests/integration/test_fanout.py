"""Weight fan-out through a relay chain/tree over real gRPC servers on 127.0.0.1, each receiver in its own
thread with its own event loop: identical hash-verified state dicts everywhere, bf16 and adapter-only
bundles, a chunk corrupted at a relay rejected by its child, a dead child skipped (its children still
served) and caught up later by Fetch, and the benchmark's smoke mode.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport.grpc_options import channel_options
from decentralized_verl.transport.weights.fanout import (
    PUSH_FLOOR_S,
    RelayWeightSource,
    WeightFanout,
    push_deadline_s,
)
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.push import OK
from decentralized_verl.transport.weights.receive import GrpcWeightSource
from decentralized_verl.transport.weights.relay import WeightRelay
from decentralized_verl.transport.weights.route import (
    Hop,
    plan_chain,
    plan_tree,
)
from decentralized_verl.transport.wire import weights as wire_weights
from tests.support.paths import ROOT
from tests.support.processes import free_port
from tests.support.relays import CHUNK, RelayThread, model_state

torch.set_num_threads(1)
REPO = ROOT


@pytest.fixture()
def nodes():
    started: list[RelayThread] = []

    def start(relay: WeightRelay | None = None, port: int = 0) -> RelayThread:
        node = RelayThread(relay, port)
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


def learner(nodes, *, dtype="bfloat16", is_adapter=False, state=None, version=1) -> RelayThread:
    node = nodes(WeightRelay(WeightPublisher(dtype=dtype, chunk_bytes=CHUNK, is_adapter=is_adapter)))
    node.relay.publish(state if state is not None else model_state(), version)
    return node


def bf16(state):
    return {k: t.to(torch.bfloat16) if t.is_floating_point() else t for k, t in state.items()}


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


# ------------------------------------------------------------------------------------------ fan-out


@pytest.mark.parametrize("fanout", [1, 2], ids=["chain", "tree"])
def test_fan_out_to_three_receivers_delivers_identical_verified_state(nodes, fanout):
    source = learner(nodes)
    receivers = [nodes() for _ in range(3)]
    route = plan_tree([r.address for r in receivers], fanout)
    results = source.call(source.relay.fan_out(1, route))
    assert results == {r.address: OK for r in receivers}

    want_sha = source.relay.publisher.get(1).manifest.digest
    want = bf16(model_state())
    for r in receivers:
        assert r.relay.pushes_received == 1  # one push each: nobody got the version twice
        held = r.relay.publisher.get(1)
        assert held.manifest.digest == want_sha and held.manifest.dtype == "bfloat16"
        version, state = r.state()
        assert version == 1
        assert_same(state, want)  # bf16 on the wire: exactly the bf16 cast of the learner's weights
        assert state["lm_head.weight"] is state["model.embed_tokens.weight"]  # tied stays tied

    # every receiver serves Fetch like the learner: a plain GrpcWeightSource pulls from the last relay
    puller = GrpcWeightSource(receivers[-1].address, wait_s=1)
    try:
        version, state = puller.fetch_latest(1)
        assert version == 1
        assert_same(state, want)
        # a resumed Fetch (from chunk 3) starts with a message that carries the manifest
        stub_msgs = list(puller._stub.Fetch(pb.FetchRequest(version=1, from_chunk=3)))
        assert stub_msgs[0].index == 3 and stub_msgs[0].HasField("manifest")
        assert [msg.index for msg in stub_msgs] == list(
            range(3, len(source.relay.publisher.get(1).bundle.chunks))
        )
    finally:
        puller.close()


def test_native_dtype_is_bit_exact_and_a_newer_version_replaces_the_old(nodes):
    source = learner(nodes, dtype=None)
    a, b = nodes(), nodes()
    route = plan_chain([a.address, b.address])
    assert source.call(source.relay.fan_out(None, route)) == {a.address: OK, b.address: OK}
    assert_same(b.state()[1], model_state())
    source.relay.publish(model_state(seed=5), 2)
    assert source.call(source.relay.fan_out(None, route)) == {a.address: OK, b.address: OK}
    version, state = b.state()
    assert version == 2 and b.relay.publisher.versions == [1, 2]
    assert_same(state, model_state(seed=5))


def test_lora_adapter_only_bundle_in_bf16(nodes):
    gen = torch.Generator().manual_seed(3)
    adapter = {
        f"base_model.model.model.layers.{i}.self_attn.{p}_proj.lora_{ab}.weight": torch.randn(
            (4, 32) if ab == "A" else (32, 4), generator=gen
        )
        for i in range(2)
        for p in ("q", "v")
        for ab in ("A", "B")
    }
    source = learner(nodes, is_adapter=True, state=adapter)
    receivers = [nodes(), nodes()]
    results = source.call(source.relay.fan_out(1, plan_tree([r.address for r in receivers], 2)))
    assert set(results.values()) == {OK}
    params = sum(t.numel() for t in adapter.values())
    for r in receivers:
        manifest = r.relay.publisher.get(1).manifest
        assert manifest.is_adapter and manifest.dtype == "bfloat16"
        # only the adapter travels: 2 bytes a parameter plus the safetensors header
        assert 2 * params < manifest.total_bytes < 2 * params + 4096
        _, state = r.state()
        assert_same(state, bf16(adapter))


class Tap(grpc.aio.StreamUnaryClientInterceptor):
    """gRPC's own client interceptor on a Push stream: every message goes out as `tap(index, raw)`."""

    def __init__(self, tap) -> None:
        self.tap = tap

    async def intercept_stream_unary(self, continuation, details, requests):
        async def tapped():
            index = 0
            async for raw in requests:
                yield self.tap(index, raw)
                index += 1

        return await continuation(details, tapped())


class TappedRelay(WeightRelay):
    """A relay whose links to its children carry every pushed message through `tap(child, index, raw)`:
    a link that changes what it carries after the relay verified it (bad RAM, a bug), or one a test
    watches. The links are the node's own channels, opened with an interceptor; the relay knows nothing."""

    def __init__(self, tap, **options) -> None:
        super().__init__(WeightPublisher(chunk_bytes=CHUNK), **options)
        self.tap = tap
        self.links: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.links:
            tap = Tap(lambda index, raw: self.tap(address, index, raw))
            options = [*channel_options(), *self.grpc_options]
            self.links[address] = grpc.aio.insecure_channel(address, options=options, interceptors=[tap])
        return self.links[address]

    async def close(self) -> None:
        for link in self.links.values():
            await link.close()
        await super().close()


def tampering(victim: str):
    """The tap of a link to ``victim`` that flips a byte of the third chunk (its digest field unchanged)."""

    def tap(child: str, index: int, raw: bytes) -> bytes:
        if child != victim or index != 2:
            return raw
        msg = pb.WeightChunk.FromString(raw)
        data = bytearray(msg.data)
        data[0] ^= 0xFF
        msg.data = bytes(data)  # the digest field still claims the original bytes
        return msg.SerializeToString()

    return tap


def test_corrupted_chunk_at_a_relay_is_rejected_by_its_child_and_the_rest_are_served(nodes):
    source = learner(nodes)
    r2_port = free_port()
    r1 = nodes(TappedRelay(tampering(f"127.0.0.1:{r2_port}")))
    r2 = nodes(port=r2_port)
    r3 = nodes()
    results = source.call(source.relay.fan_out(1, plan_chain([r1.address, r2.address, r3.address])))
    assert results[r1.address] == OK
    assert results[r2.address].startswith("failed") and "digest" in results[r2.address]
    assert results[r3.address] == OK  # r1 adopted r3 when r2 rejected the push
    assert r2.relay.publisher.latest_version is None  # nothing partial or corrupt is held
    assert_same(r3.state()[1], bf16(model_state()))

    # r2 catches up later by Fetch from its parent (Fetch is not tampered with)
    assert r2.call(r2.relay.catch_up(r1.address, 1)) == 1
    assert_same(r2.state()[1], bf16(model_state()))


def test_dead_child_is_skipped_and_catches_up_by_fetch_later(nodes):
    source = learner(nodes)
    r1, r3 = nodes(), nodes()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    results = source.call(source.relay.fan_out(1, plan_chain([r1.address, dead, r3.address])))
    assert results[r1.address] == OK and results[r3.address] == OK
    assert results[dead].startswith("failed: UNAVAILABLE")
    assert_same(r3.state()[1], bf16(model_state()))

    revived = nodes(port=int(dead.rsplit(":", 1)[1]))
    assert revived.relay.publisher.latest_version is None
    assert revived.call(revived.relay.catch_up(r1.address, 1)) == 1
    assert revived.relay.publisher.get(1).manifest.digest == source.relay.publisher.get(1).manifest.digest
    assert_same(revived.state()[1], bf16(model_state()))
    # catching up again is a no-op; waiting for a version nobody has is a clear error
    assert revived.call(revived.relay.catch_up(r1.address, 1)) == 1
    with pytest.raises(WireError, match="no version >= 2"):
        revived.call(revived.relay.catch_up(r1.address, 2, wait_s=0.2))


def test_concurrent_fetch_baseline_and_bad_pushes(nodes):
    source = learner(nodes)
    receivers = [nodes() for _ in range(3)]

    futures = [
        asyncio.run_coroutine_threadsafe(r.relay.catch_up(source.address, 1), r.loop) for r in receivers
    ]
    assert [f.result(30) for f in futures] == [1, 1, 1]
    for r in receivers:
        assert_same(r.state()[1], bf16(model_state()))

    # a push without a manifest, and one whose whole-bundle hash is wrong, are refused and hold nothing
    target = nodes()
    held = source.relay.publisher.get(1)
    raws = list(source.relay.wire(held))

    async def push(messages):
        ch = grpc.aio.insecure_channel(target.address)
        call = ch.stream_unary("/dverl.v1.Weights/Push", lambda b: b, pb.PushAck.FromString)
        try:
            return await call(iter(messages))
        finally:
            await ch.close()

    no_manifest = pb.WeightChunk.FromString(raws[0])
    no_manifest.ClearField("manifest")
    ack = source.call(push([no_manifest.SerializeToString(), *raws[1:]]))
    assert not ack.ok and "manifest" in ack.reason

    forged = pb.WeightChunk.FromString(raws[0])
    forged.manifest.digest = "0" * 64  # every chunk still matches its hash; the whole does not
    ack = source.call(push([forged.SerializeToString(), *raws[1:]]))
    assert not ack.ok and "digest" in ack.reason
    assert target.relay.publisher.latest_version is None

    ack = source.call(push(raws[:-1]))  # a truncated push
    assert not ack.ok and "missing" in ack.reason
    ack = source.call(push(raws))
    assert ack.ok and ack.chunks_received == len(raws) and target.relay.publisher.latest_version == 1


def test_fan_out_of_a_version_not_held_is_an_error(nodes):
    source = learner(nodes)
    with pytest.raises(WireError, match="version 7 is not held"):
        source.call(source.relay.fan_out(7, ()))


class CountingHash:
    """Stands in for `digest_hex` in `transport.wire.weights` (chunk checks): counts the bytes hashed."""

    def __init__(self) -> None:
        from decentralized_verl.transport.digest import digest_hex

        self.real = digest_hex
        self.bytes = 0
        self.lock = threading.Lock()

    def __call__(self, data=b""):
        with self.lock:
            self.bytes += len(data)
        return self.real(data)


def test_each_receiver_hashes_every_byte_exactly_once(nodes, monkeypatch):
    source = learner(nodes)
    receivers = [nodes(WeightRelay(WeightPublisher(chunk_bytes=CHUNK), verify_threads=3)) for _ in range(2)]
    total = source.relay.publisher.get(1).manifest.total_bytes
    counter = CountingHash()
    monkeypatch.setattr(wire_weights, "digest_hex", counter)  # where chunk_from_proto hashes
    results = source.call(source.relay.fan_out(1, plan_chain([r.address for r in receivers])))
    assert set(results.values()) == {OK}
    assert counter.bytes == 2 * total  # two receivers, one pass each (was two passes each)
    counter.bytes = 0
    late = nodes()
    assert late.call(late.relay.catch_up(receivers[1].address, 1)) == 1
    assert counter.bytes == total
    for r in [*receivers, late]:
        assert_same(r.state()[1], bf16(model_state()))


def test_parallel_verification_still_stops_at_a_corrupted_chunk(nodes):
    """With 4 hashing threads, chunks after the bad one may already be verified; none is forwarded past
    it and the receiver holds nothing."""
    source = learner(nodes)
    r2_port = free_port()
    r1 = nodes(TappedRelay(tampering(f"127.0.0.1:{r2_port}")))
    forwarded: list[int] = []  # what r2 passed on to its children

    def spy(child: str, index: int, raw: bytes) -> bytes:
        forwarded.append(index)
        return raw

    r2 = nodes(TappedRelay(spy, verify_threads=4), port=r2_port)
    r3 = nodes()
    results = source.call(source.relay.fan_out(1, plan_chain([r1.address, r2.address, r3.address])))
    assert results[r2.address].startswith("failed") and "chunk[2].digest" in results[r2.address]
    assert max(forwarded, default=-1) < 2  # chunks 0 and 1 at most went on to r3 before the failure
    assert r2.relay.publisher.latest_version is None and r2.relay.receiving == {}
    assert results[r3.address] == OK  # adopted by r1
    assert_same(r3.state()[1], bf16(model_state()))


def test_relay_weight_source_reads_pushes_and_pulls_what_it_missed(nodes):
    source = learner(nodes)
    worker = nodes()
    puller = RelayWeightSource(worker.relay, source.address, worker.loop, wait_s=5, push_grace_s=0.1)
    # nothing pushed yet: after the grace period it pulls from the learner, verified
    version, state = puller.fetch_latest(1)
    assert version == 1 and puller.pulls == 1
    assert_same(state, bf16(model_state()))
    # still not pushed to (the learner pushes from two workers on): the next version is pulled at once,
    # without waiting out the grace again
    source.relay.publish(model_state(seed=2), 2)
    puller.push_grace_s = 30.0
    began = time.monotonic()
    version, state = puller.fetch_latest(2)
    assert version == 2 and puller.pulls == 2 and time.monotonic() - began < 15.0
    assert_same(state, bf16(model_state(seed=2)))
    # a pushed version is read from the relay, with no pull
    source.relay.publish(model_state(seed=3), 3)
    assert source.call(source.relay.fan_out(3, plan_chain([worker.address]))) == {worker.address: OK}
    version, state = puller.fetch_latest(3)
    assert version == 3 and puller.pulls == 2 and puller.pushed_last is True
    assert_same(state, bf16(model_state(seed=3)))
    # asking for a version nobody has is a clear error after wait_s
    puller.wait_s, puller.push_grace_s = 0.3, 0.1
    with pytest.raises(WireError, match="no version >= 4"):
        puller.fetch_latest(4)
    with pytest.raises(RuntimeError, match="event loop"):  # it blocks: never on the relay's own loop
        worker.call(_call_async(puller.fetch_latest, 2))


def test_a_receiver_that_hangs_alive_is_cut_off_and_the_push_returns(nodes):
    relay = WeightRelay(WeightPublisher(chunk_bytes=CHUNK))
    home = nodes(relay)
    good, hung = nodes(), nodes()
    relay.publish(model_state(), 1)
    # Its event loop stops answering: the port still accepts, nothing reads or acknowledges.
    hung.loop.call_soon_threadsafe(time.sleep, 6.0)
    began = time.monotonic()
    route = [Hop(good.address), Hop(hung.address)]
    results = home.call(relay.fan_out(1, route, timeout_s=1.5))
    assert time.monotonic() - began < 5.0
    assert results[good.address] == OK
    assert results[hung.address] == "not sent: no answer in 2 s"
    assert_same(good.state()[1], bf16(model_state()))
    assert push_deadline_s(0) == PUSH_FLOOR_S and push_deadline_s(500_000_000) == PUSH_FLOOR_S + 10.0


async def _call_async(fn, *args):
    return fn(*args)


def test_weight_fanout_pushes_only_with_two_or_more_workers_and_survives_a_bad_route(nodes):
    publisher = WeightPublisher(chunk_bytes=CHUNK)
    home = nodes(WeightRelay(publisher))  # only for its event loop and Weights service
    a, b = nodes(), nodes()
    fanout = WeightFanout(publisher, [a.address])
    assert not fanout.pushing
    assert home.call(fanout.publish(model_state(), 1)) == {}  # held for pulls, not pushed
    assert publisher.latest_version == 1 and a.relay.publisher.latest_version is None
    fanout.add_receiver(b.address)
    fanout.add_receiver(b.address)  # idempotent
    assert fanout.pushing and fanout.route() == plan_chain([a.address, b.address])
    results = fanout.publish_blocking(model_state(seed=4), 2, home.loop)
    assert results == {a.address: OK, b.address: OK} == fanout.last_results
    assert_same(b.state()[1], bf16(model_state(seed=4)))
    fanout.remove_receiver(a.address)
    assert not fanout.pushing
    with pytest.raises(RuntimeError, match="own event loop"):
        home.call(_call_async(fanout.publish_blocking, model_state(), 3, home.loop))
    with pytest.raises(ValueError, match="min_receivers"):
        WeightFanout(publisher, min_receivers=0)
    home.call(fanout.close())


# ------------------------------------------------------------------------------------------ benchmark


def test_benchmark_smoke_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "weight_sync.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| method" in out and "weight_sync.py --smoke" in out
    for method in ("raw socket", "raw socket chain", "grpc fetch", "grpc chain"):
        assert f"| {method} |" in out, method
    for n in (1, 2, 4):
        assert f"| {n} |" in out
