"""Rollout over real gRPC: every item answered exactly once, log-probs equal to an independent recompute,
seeded samples independent of batching, and a client that rejects every kind of garbage a worker may send.
"""

from __future__ import annotations

import asyncio
import math
import re

import grpc
import pytest
import torch

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.interfaces import RolloutClient, WorkerFailure
from decentralized_verl.core.samples import Prompt, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.seeds import item_seed
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.serving.local import LocalRolloutClient, stream_in_thread
from decentralized_verl.serving.rollout import RolloutWorker, to_requests
from decentralized_verl.serving.servicers import HealthServicer, RolloutServicer, serve
from decentralized_verl.spec import TinyModelSpec
from decentralized_verl.spec.catalogue.backends import HF
from decentralized_verl.transport.clients import GrpcRolloutClient, wait_ready
from decentralized_verl.transport.messages import WireLimits

torch.set_num_threads(1)

TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=96)


def prompts(tokenizer, texts=("1+1=", "2+3=", "hello ", "7*6=?")):
    return [Prompt(f"p{i}", i, tuple(tokenizer.encode(t)), t, ground_truth="") for i, t in enumerate(texts)]


def recompute_logprobs(model, samples, pad_id, temperature):
    """The learner's way: one padded forward pass without cache over prompt + response."""
    batch = collate(list(samples), pad_id)
    with torch.no_grad():
        logp = response_logprobs(model, batch, temperature)[0]
    return [logp[i, : len(s.response_ids)].tolist() for i, s in enumerate(samples)]


async def start_rollout(model, tokenizer, worker_id="r0", limits=None):
    worker = RolloutWorker(make_backend(HF, model, tokenizer, max_batch_size=3), worker_id)
    server = await serve(0, RolloutServicer(worker, limits), HealthServicer("rollout", worker_id, ready=True))
    return worker, server, f"127.0.0.1:{server.port}"


async def collect(client, items, sampling, version):
    return [s async for s in client.generate(items, sampling, version)]


async def test_grpc_rollout_answers_every_item_once_with_true_logprobs(policy):
    model, tok = policy
    _, server, address = await start_rollout(model, tok)
    client = GrpcRolloutClient(address, "r0")
    try:
        assert isinstance(client, RolloutClient)
        ps = prompts(tok)
        items = [(p, k) for p in ps for k in (0, 1, 5)]
        sampling = SamplingParams(max_new_tokens=6, temperature=0.8, seed=11)
        samples = await collect(client, items, sampling, 0)

        assert sorted(s.key for s in samples) == sorted((p.prompt_id, k) for p, k in items)
        by_id = {p.prompt_id: p for p in ps}
        for s in samples:
            assert s.prompt is by_id[s.prompt.prompt_id]  # the coordinator's own Prompt comes back
            assert s.policy_version == 0 and s.worker_id == "r0"
            assert 1 <= len(s.response_ids) <= 6 and len(s.logprobs) == len(s.response_ids)
            assert s.finish_reason in ("stop", "length")
            assert s.text == tok.decode(s.response_ids, skip_special_tokens=True)
        expected = recompute_logprobs(model, samples, tok.pad_token_id, 0.8)
        for s, want in zip(samples, expected, strict=True):
            assert s.logprobs == pytest.approx(want, abs=1e-4)

        info = await client.info()
        assert (info.worker_id, info.role, info.policy_version, info.backend) == ("r0", "rollout", 0, "hf")
        assert info.tokens_per_second > 0
    finally:
        await client.close()
        await server.stop(None)


async def test_seeded_samples_do_not_depend_on_batching_or_transport(policy):
    model, tok = policy
    _, server, address = await start_rollout(model, tok)
    grpc_client = GrpcRolloutClient(address, "r0")
    local = LocalRolloutClient(RolloutWorker(make_backend(HF, model, tok, max_batch_size=8), "local"))
    try:
        ps = prompts(tok)
        items = [(p, k) for p in ps for k in range(2)]
        sampling = SamplingParams(max_new_tokens=5, temperature=1.0, seed=3)
        together = {s.key: s.response_ids for s in await collect(grpc_client, items, sampling, 0)}
        one_by_one = {}
        for item in reversed(items):
            for s in await collect(grpc_client, [item], sampling, 0):
                one_by_one[s.key] = s.response_ids
        in_process = {s.key: s.response_ids for s in await collect(local, items, sampling, 0)}
        assert together == one_by_one == in_process
        other_seed = {
            s.key: s.response_ids for s in await collect(local, items, SamplingParams(5, 1.0, seed=4), 0)
        }
        assert other_seed != together
    finally:
        await grpc_client.close()
        await server.stop(None)


def test_item_seed_and_requests():
    assert item_seed(1, "p", 0) == item_seed(1, "p", 0)
    assert len({item_seed(1, "p", 0), item_seed(1, "p", 1), item_seed(1, "q", 0), item_seed(2, "p", 0)}) == 4
    assert 0 <= item_seed(2**40, "x" * 100, 7) < 2**63
    p = Prompt("p", 0, (5, 6), "ab")
    reqs = to_requests([(p, 0), (p, 1)], SamplingParams(max_new_tokens=4, seed=None))
    assert [r.prompt_id for r in reqs] == ["0", "1"]  # positions: one prompt may appear twice
    assert all(r.params.n == 1 and r.params.seed is None for r in reqs)


async def test_bad_request_is_invalid_argument_naming_the_field(policy):
    model, tok = policy
    _, server, address = await start_rollout(model, tok, limits=WireLimits(vocab_size=len(tok)))
    client = GrpcRolloutClient(address, "r0")
    try:
        bad = Prompt("bad", 0, (5, 10_000), "")
        with pytest.raises(WorkerFailure) as info:
            await collect(client, [(bad, 0)], SamplingParams(max_new_tokens=3), 0)
        assert "INVALID_ARGUMENT" in info.value.reason
        assert "items[0].prompt_token_ids[1]" in info.value.reason
        too_long = Prompt("long", 0, tuple([5] * 95), "")  # 95 + 3 > 96 positions: the backend refuses
        with pytest.raises(WorkerFailure, match=r"INVALID_ARGUMENT.*positions"):
            await collect(client, [(too_long, 0)], SamplingParams(max_new_tokens=3), 0)
        # a worker without a weight source cannot serve a newer version: it says so, nothing is made up
        with pytest.raises(WorkerFailure, match="no weight source"):
            await collect(client, [(prompts(tok)[0], 0)], SamplingParams(max_new_tokens=3), 4)
    finally:
        await client.close()
        await server.stop(None)


# ------------------------------------------------------------------------------- a lying worker


class GarbageRollout(pb_grpc.RolloutServicer):
    """Answers each request in one way that breaks the contract."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def Generate(self, request, context):
        for i, item in enumerate(request.items):
            ids, logprobs = [7, 8, 9], [-0.5, -1.0, -0.25]
            version, prompt_id, index = request.policy_version, item.prompt_id, item.sample_index
            if self.mode == "nan" and i == 1:
                logprobs[2] = math.nan
            if self.mode == "positive" and i == 0:
                logprobs[0] = 0.7
            if self.mode == "version":
                version += 1
            if self.mode == "length" and i == 1:
                logprobs = logprobs[:2]
            if self.mode == "unrequested" and i == 1:
                prompt_id = "nobody-asked"
            if self.mode == "duplicate" and i == 1:
                prompt_id, index = request.items[0].prompt_id, request.items[0].sample_index
            if self.mode == "missing" and i == 1:
                continue
            if self.mode == "too_long":
                ids, logprobs = ids * 3, logprobs * 3
            if self.mode == "abort" and i == 1:
                await context.abort(grpc.StatusCode.INTERNAL, "GPU fell off")
            if self.mode == "slow":
                await asyncio.sleep(5)
            yield pb.GenerateResult(
                request_id=request.request_id,
                prompt_id=prompt_id,
                sample_index=index,
                response_token_ids=ids,
                logprobs=logprobs,
                finish_reason=pb.FINISH_REASON_STOP,
                text="xyz",
                policy_version=version,
                worker_id="liar",
                generation_seconds=0.1,
            )


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("nan", r"results\[1\]\.logprobs\[2\]: is NaN"),
        ("positive", r"results\[0\]\.logprobs\[0\]: log-prob must be <= 0"),
        ("version", r"results\[0\]\.policy_version: got 3, expected 2"),
        ("length", r"results\[1\]\.logprobs: length 2 does not match response_token_ids length 3"),
        ("unrequested", r"results\[1\]\.sample_index: sample 0 of prompt 'nobody-asked' was not requested"),
        ("duplicate", r"results\[1\].*already answered by results\[0\]"),
        ("missing", r"1 samples unanswered: p1#0"),
        ("too_long", r"length 9 exceeds max_new_tokens 4"),
        ("abort", r"Generate: INTERNAL: GPU fell off"),
        ("slow", r"DEADLINE_EXCEEDED"),
    ],
)
async def test_client_rejects_garbage_with_the_reason(mode, reason):
    server = await serve(0, GarbageRollout(mode))
    deadline = 0.5 if mode == "slow" else 30.0
    client = GrpcRolloutClient(f"127.0.0.1:{server.port}", "liar-1", deadline_s=deadline)
    items = [(Prompt(f"p{i}", i, (5, 6, 7), ""), 0) for i in range(3)]
    got = []
    try:
        with pytest.raises(WorkerFailure) as info:
            async for s in client.generate(items, SamplingParams(max_new_tokens=4), 2):
                got.append(s)
        assert info.value.worker_id == "liar-1"
        assert re.search(reason, info.value.reason), info.value.reason
        assert len(got) <= 2  # what came before the fault was valid and is kept by the caller
        assert all(s.worker_id == "liar-1" and s.policy_version == 2 for s in got)
    finally:
        await client.close()
        await server.stop(None)


async def test_unreachable_worker_is_a_worker_failure():
    client = GrpcRolloutClient("127.0.0.1:1", "ghost", deadline_s=2)
    with pytest.raises(WorkerFailure, match="UNAVAILABLE"):
        await collect(client, [(Prompt("p", 0, (5,), ""), 0)], SamplingParams(max_new_tokens=2), 0)
    await client.close()


# ------------------------------------------------------------------------------- health, threads


async def test_health_ready_flag():
    health = HealthServicer("reference", "ref-0")
    server = await serve(0, health)
    address = f"127.0.0.1:{server.port}"
    try:
        with pytest.raises(TimeoutError, match="says not ready"):
            await wait_ready(address, 2.0, poll_s=0.05)
        health.set_ready()
        ready = await wait_ready(address, 5)
        assert (ready.ready, ready.role, ready.worker_id) == (True, "reference", "ref-0")
    finally:
        await server.stop(None)
    with pytest.raises(TimeoutError, match="not ready after"):
        await wait_ready(address, 1.0, poll_s=0.05)
    with pytest.raises(Exception, match="unknown role"):
        HealthServicer("chef", "x")
    with pytest.raises(TypeError, match="not a servicer"):
        await serve(0, object())


async def test_stream_in_thread_forwards_items_errors_and_stops_early():
    assert [x async for x in stream_in_thread(lambda: iter(range(5)))] == [0, 1, 2, 3, 4]

    def broken():
        yield 1
        raise ValueError("boom")

    got = []
    with pytest.raises(ValueError, match="boom"):
        async for x in stream_in_thread(broken):
            got.append(x)
    assert got == [1]

    closed = asyncio.Event()
    loop = asyncio.get_running_loop()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            loop.call_soon_threadsafe(closed.set)

    async for x in stream_in_thread(endless):
        if x == 3:
            break
    await asyncio.wait_for(closed.wait(), 5)  # the producer was closed, not left running
