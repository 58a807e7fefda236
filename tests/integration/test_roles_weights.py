"""Weights learner -> rollout over a real `Weights` service: a version bump reaches the worker and changes
what it generates, a worker that missed versions jumps to the latest, a corrupted chunk changes nothing,
a broken stream resumes from the next chunk, and a pushed version is verified before it is held.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.interfaces import WorkerFailure
from decentralized_verl.core.samples import Prompt, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.errors import WireError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.servicers import RolloutServicer, serve
from decentralized_verl.spec import ModelSpec, TinyModelSpec
from decentralized_verl.spec.catalogue.backends import HF
from decentralized_verl.transport.clients import GrpcRolloutClient
from decentralized_verl.transport.grpc_options import channel_options
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.receive import GrpcWeightSource, LocalWeightSource
from decentralized_verl.transport.weights.service import WeightsServicer

torch.set_num_threads(1)

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=96)
CHUNK = 8192  # the tiny model is ~100 KB in float32: a dozen chunks


def tiny(seed: int):
    return load_model_and_tokenizer(ModelSpec(tiny=TinyModelSpec(seed=seed, **TINY)))


@pytest.fixture()
def rollout():
    model, tok = tiny(0)
    return model, tok


@pytest.fixture(scope="module")
def learner_states():
    """Three successive 'learner' versions: different seeds give clearly different weights."""
    return {v: {k: t.detach().clone() for k, t in tiny(10 + v)[0].state_dict().items()} for v in (1, 2, 3)}


def same_weights(model, state) -> bool:
    own = model.state_dict()
    return all(torch.equal(own[k], state[k]) for k in state)


def snapshot(model):
    return {k: t.detach().clone() for k, t in model.state_dict().items()}


async def start_weights(publisher, servicer_cls=WeightsServicer):
    server = await serve(0, servicer_cls(publisher))
    return server, f"127.0.0.1:{server.port}"


async def test_version_bump_pulls_new_weights_and_outputs_follow_them(rollout, learner_states):
    model, tok = rollout
    publisher = WeightPublisher(dtype=None, chunk_bytes=CHUNK)  # native dtype: bit-exact transfer
    weights_server, weights_address = await start_weights(publisher)
    source = GrpcWeightSource(weights_address, wait_s=2)
    worker = RolloutWorker(make_backend(HF, model, tok, max_batch_size=4), "r0", source)
    rollout_server = await serve(0, RolloutServicer(worker))
    client = GrpcRolloutClient(f"127.0.0.1:{rollout_server.port}", "r0")
    try:
        items = [
            (Prompt(f"p{i}", i, tuple(tok.encode(t)), t), 0) for i, t in enumerate(["ab", "1+2=", "xyz"])
        ]
        greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
        before = {s.key: s.response_ids async for s in client.generate(items, greedy, 0)}
        assert worker.weight_loads == 0

        publisher.publish(learner_states[1], 1)
        samples = [s async for s in client.generate(items, greedy, 1)]
        assert worker.version == 1 and worker.weight_loads == 1
        assert {s.policy_version for s in samples} == {1}
        assert same_weights(model, learner_states[1])
        assert {s.key: s.response_ids for s in samples} != before

        # the outputs are those of the new weights: a separate model built from them agrees
        reference, _ = tiny(99)
        reference.load_state_dict(learner_states[1])
        batch = collate(samples, tok.pad_token_id)
        with torch.no_grad():
            logp, _ = response_logprobs(reference, batch)
            p, r = batch.prompt_length, batch.response_mask.shape[1]
            full = reference(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
            )
            logits = full.logits[:, p - 1 : p - 1 + r]
        for i, s in enumerate(samples):
            n = len(s.response_ids)
            assert s.logprobs == pytest.approx(logp[i, :n].tolist(), abs=1e-4)
            assert list(s.response_ids) == logits[i, :n].argmax(-1).tolist()  # greedy under the new weights

        # asking again for version 1 does not refetch
        _ = [s async for s in client.generate(items[:1], greedy, 1)]
        assert worker.weight_loads == 1 and len(source.fetch_calls) == 1
    finally:
        await client.close()
        source.close()
        await rollout_server.stop(None)
        await weights_server.stop(None)


async def test_worker_that_missed_versions_jumps_to_the_latest(rollout, learner_states):
    model, tok = rollout
    publisher = WeightPublisher(dtype="bfloat16", chunk_bytes=CHUNK, keep=2)
    for v in (1, 2, 3):
        publisher.publish(learner_states[v], v)
    assert publisher.versions == [2, 3] and publisher.latest_version == 3
    server, address = await start_weights(publisher)
    source = GrpcWeightSource(address, wait_s=1)
    worker = RolloutWorker(make_backend(HF, model, tok), "r0", source)
    try:
        held = await asyncio.to_thread(worker.ensure_version, 2)
        assert held == 3 and worker.version == 3 and worker.weight_loads == 1
        assert source.fetch_calls == [(3, 0)]  # one transfer, of the latest version only
        bf16 = {k: t.to(torch.bfloat16).to(torch.float32) for k, t in learner_states[3].items()}
        assert same_weights(model, bf16)  # bf16 on the wire, cast back to the model's float32
        assert model.model.embed_tokens.weight.dtype == torch.float32
        # nothing newer than what is published: a clear error after the wait, weights kept
        with pytest.raises(WireError, match="no version >= 4"):
            await asyncio.to_thread(worker.ensure_version, 4)
        assert worker.version == 3
    finally:
        source.close()
        await server.stop(None)


class CorruptingWeights(WeightsServicer):
    """Flips one byte of chunk 1 (keeping the advertised hash) on every stream."""

    async def Fetch(self, request, context):
        async for msg in super().Fetch(request, context):
            if msg.index == 1:
                data = bytearray(msg.data)
                data[len(data) // 2] ^= 0xFF
                msg.data = bytes(data)
            yield msg


class BreakingWeights(WeightsServicer):
    """The first stream dies after two chunks; later streams are fine."""

    calls = 0

    async def Fetch(self, request, context):
        type(self).calls += 1
        sent = 0
        async for msg in super().Fetch(request, context):
            if type(self).calls == 1 and sent == 2:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
            sent += 1
            yield msg


async def test_corrupted_chunk_is_rejected_and_weights_stay(rollout, learner_states):
    model, tok = rollout
    before = snapshot(model)
    publisher = WeightPublisher(dtype=None, chunk_bytes=CHUNK)
    publisher.publish(learner_states[1], 1)
    server, address = await start_weights(publisher, CorruptingWeights)
    source = GrpcWeightSource(address, wait_s=1)
    worker = RolloutWorker(make_backend(HF, model, tok), "r0", source)
    rollout_server = await serve(0, RolloutServicer(worker))
    client = GrpcRolloutClient(f"127.0.0.1:{rollout_server.port}", "r0")
    try:
        with pytest.raises(WireError, match=r"failed twice: .*chunk\[1\]\.digest"):
            await asyncio.to_thread(source.fetch_latest, 1)
        assert source.fetch_calls == [(1, 0), (1, 1)]  # retried once, from the bad chunk
        # through the rollout service: the coordinator gets a WorkerFailure naming the cause
        item = (Prompt("p", 0, tuple(tok.encode("ab")), "ab"), 0)
        with pytest.raises(WorkerFailure, match=r"UNAVAILABLE.*digest"):
            _ = [s async for s in client.generate([item], SamplingParams(max_new_tokens=3), 1)]
        assert worker.version == 0 and worker.weight_loads == 0
        assert same_weights(model, before)
    finally:
        await client.close()
        source.close()
        await rollout_server.stop(None)
        await server.stop(None)


async def test_broken_stream_resumes_from_the_next_chunk(rollout, learner_states):
    BreakingWeights.calls = 0
    publisher = WeightPublisher(dtype=None, chunk_bytes=CHUNK)
    publisher.publish(learner_states[2], 2)
    server, address = await start_weights(publisher, BreakingWeights)
    source = GrpcWeightSource(address, wait_s=1)
    try:
        version, state = await asyncio.to_thread(source.fetch_latest, 1)
        assert version == 2 and source.fetch_calls == [(2, 0), (2, 2)]
        assert all(torch.equal(state[k], learner_states[2][k]) for k in learner_states[2])
    finally:
        source.close()
        await server.stop(None)


async def test_local_source_and_publisher_rules(learner_states):
    publisher = WeightPublisher(dtype=None, chunk_bytes=CHUNK)
    source = LocalWeightSource(publisher, wait_s=0.2)
    with pytest.raises(WireError, match="no version >= 1"):
        source.fetch_latest(1)

    async def publish_later():
        await asyncio.sleep(0.1)
        publisher.publish(learner_states[1], 1)

    task = asyncio.create_task(publish_later())
    source.wait_s = 5
    version, state = await asyncio.to_thread(source.fetch_latest, 1)  # waits for the publish
    await task
    assert version == 1 and all(torch.equal(state[k], learner_states[1][k]) for k in state)
    with pytest.raises(ValueError, match="not newer"):
        publisher.publish(learner_states[1], 1)
    manifest = publisher.get().manifest
    assert manifest.dtype == "native" and manifest.format == "safetensors" and not manifest.is_adapter
    assert len(manifest.chunk_digests) == -(-manifest.total_bytes // CHUNK)


async def test_manifest_not_found_and_push_is_verified(learner_states):
    source_pub = WeightPublisher(dtype="bfloat16", chunk_bytes=CHUNK)
    source_pub.publish(learner_states[1], 1)
    relay_pub = WeightPublisher()
    server, address = await start_weights(relay_pub)
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        stub = pb_grpc.WeightsStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetManifest(pb.ManifestRequest(latest=True))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        held = source_pub.get(1)
        msgs = [WeightsServicer.chunk_message(held, c, first=c.index == 0) for c in held.bundle.chunks]

        bad = [pb.WeightChunk() for _ in msgs]
        for b, good in zip(bad, msgs, strict=True):
            b.CopyFrom(good)
        bad[-1].data = bytes(len(bad[-1].data))  # zeros: same size, wrong bytes
        ack = await stub.Push(iter(bad))
        assert not ack.ok and "digest" in ack.reason and relay_pub.latest_version is None

        ack = await stub.Push(iter(msgs))
        assert ack.ok and ack.version == 1 and ack.chunks_received == len(msgs)
        manifest = await stub.GetManifest(pb.ManifestRequest(version=1))
        assert manifest.digest == held.manifest.digest
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetManifest(pb.ManifestRequest(version=7))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

    source = GrpcWeightSource(address, wait_s=1)  # a peer pulls from the relay: same tensors
    try:
        _, relayed = await asyncio.to_thread(source.fetch_latest, 1)
        _, direct = LocalWeightSource(source_pub).fetch_latest(1)
        assert relayed.keys() == direct.keys()
        assert all(torch.equal(relayed[k], direct[k]) for k in direct)
    finally:
        source.close()
        await server.stop(None)
