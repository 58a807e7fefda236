"""Reference, critic and reward roles over real gRPC against local workers and slow references:
one unpadded forward pass per sample, a hand-built value head readout, `rewards.score` itself.
"""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch

from decentralized_verl.core.interfaces import (
    CriticClient,
    ReferenceClient,
    RewardClient,
    WorkerFailure,
)
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.models.loading import load_sequence_classifier
from decentralized_verl.rewards import RewardModelScorer, score
from decentralized_verl.serving.local import LocalCriticClient, LocalReferenceClient, LocalRewardClient
from decentralized_verl.serving.scoring import CriticWorker, ReferenceWorker, RewardWorker
from decentralized_verl.serving.servicers import (
    CriticServicer,
    ReferenceServicer,
    RewardServicer,
    serve,
)
from decentralized_verl.spec import ModelSpec, TinyModelSpec
from decentralized_verl.training.value_model import ValueModel
from decentralized_verl.transport.clients import (
    GrpcCriticClient,
    GrpcReferenceClient,
    GrpcRewardClient,
)

torch.set_num_threads(1)

TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=96)


def make_samples(tok, n=7, seed=0):
    """Prompts and responses of different lengths, so padding on both sides is exercised."""
    rng = random.Random(seed)
    vocab = len(tok)
    out = []
    for i in range(n):
        prompt = tuple(rng.randrange(7, vocab) for _ in range(rng.randint(2, 9)))
        response = tuple(rng.randrange(7, vocab) for _ in range(rng.randint(1, 6)))
        out.append(
            Sample(
                prompt=Prompt(f"p{i}", i, prompt, "q"),
                sample_index=0,
                response_ids=response,
                logprobs=tuple(-1.0 for _ in response),
                finish_reason="length",
                text="",
                policy_version=0,
            )
        )
    return out


def slow_logprobs(model, sample, temperature):
    """One sample, no padding: log_softmax(logits / T) of each response token given its prefix."""
    ids = torch.tensor([sample.prompt.token_ids + sample.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    p = len(sample.prompt.token_ids)
    logp = torch.log_softmax(logits, -1)
    return [float(logp[p - 1 + t, tok]) for t, tok in enumerate(sample.response_ids)]


def f32(rows):
    return [tuple(float(torch.tensor(x, dtype=torch.float32)) for x in row) for row in rows]


async def test_reference_logprobs_grpc_equal_local_and_slow_reference(policy):
    model, tok = policy
    worker = ReferenceWorker(model, temperature=0.7, microbatch_size=3, pad_token_id=tok.pad_token_id)
    server = await serve(0, ReferenceServicer(worker))
    client = GrpcReferenceClient(f"127.0.0.1:{server.port}", "ref-0")
    try:
        assert isinstance(client, ReferenceClient)
        samples = make_samples(tok)
        remote = await client.logprobs(samples)
        local = await LocalReferenceClient(worker).logprobs(samples)
        assert remote == f32(local)  # float32 on the wire, nothing else changes
        for s, row in zip(samples, remote, strict=True):
            assert len(row) == len(s.response_ids)
            assert row == pytest.approx(slow_logprobs(model, s, 0.7), abs=1e-5)

        empty = samples[0].with_(response_ids=())
        with pytest.raises(WorkerFailure, match=r"INVALID_ARGUMENT.*items\[1\]\.response_token_ids"):
            await client.logprobs([samples[1], empty])
    finally:
        await client.close()
        await server.stop(None)


def test_value_model_reads_the_hidden_state_before_each_response_token(policy):
    model, tok = policy
    critic = ValueModel.from_causal_lm(model)
    assert critic.backbone is not model.model  # a copy: training the critic leaves the policy alone
    samples = make_samples(tok, n=4, seed=1)
    batch = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        values = critic.values(batch)
        assert values.shape == batch.response_mask.shape
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt.token_ids + s.response_ids])
            hidden = model.model(input_ids=ids).last_hidden_state[0]
            p, n = len(s.prompt.token_ids), len(s.response_ids)
            want = critic.value_head(hidden[p - 1 : p - 1 + n]).squeeze(-1)
            assert values[i, :n].tolist() == pytest.approx(want.tolist(), abs=1e-5)
            assert values[i, n:].abs().sum() == 0


async def test_critic_trains_toward_fixed_returns_same_over_grpc_and_local(policy):
    model, tok = policy
    base = ValueModel.from_causal_lm(model)
    remote_worker = CriticWorker(copy.deepcopy(base), learning_rate=1e-2, microbatch_size=3)
    local_worker = CriticWorker(copy.deepcopy(base), learning_rate=1e-2, microbatch_size=3)
    server = await serve(0, CriticServicer(remote_worker))
    remote = GrpcCriticClient(f"127.0.0.1:{server.port}", "critic-0")
    local = LocalCriticClient(local_worker)
    try:
        assert isinstance(remote, CriticClient) and isinstance(local, CriticClient)
        samples = make_samples(tok, n=6, seed=2)
        returns = [tuple(0.5 + 0.1 * t for t in range(len(s.response_ids))) for s in samples]

        def mean_error(values):
            flat = [
                abs(v - r)
                for row, ret in zip(values, returns, strict=True)
                for v, r in zip(row, ret, strict=True)
            ]
            return sum(flat) / len(flat)

        start_error = mean_error(await remote.values(samples))
        losses = []
        for _ in range(12):
            old = await remote.values(samples)
            assert old == f32(await local.values(samples))
            loss = await remote.train(samples, returns, old, 0)
            local_loss = await local.train(samples, returns, old, 0)
            assert loss == pytest.approx(local_loss, rel=1e-5)
            losses.append(loss)
        assert losses[-1] < 0.25 * losses[0], losses
        assert all(b < a for a, b in itertools.pairwise(losses)), losses
        assert remote_worker.version == 12
        assert mean_error(await remote.values(samples)) < 0.5 * start_error

        with pytest.raises(WorkerFailure, match=r"INVALID_ARGUMENT.*items\[0\]\.returns: length 1"):
            await remote.train(samples[:1], [(1.0,)], [(0.0,) * len(samples[0].response_ids)], 0)
        assert remote_worker.version == 12  # a rejected request changes nothing
    finally:
        await remote.close()
        await server.stop(None)


def test_critic_train_token_mean_is_independent_of_microbatching(policy):
    model, tok = policy
    base = ValueModel.from_causal_lm(model)
    samples = make_samples(tok, n=5, seed=3)
    returns = [tuple(1.0 for _ in s.response_ids) for s in samples]
    old = [tuple(0.0 for _ in s.response_ids) for s in samples]
    whole = CriticWorker(copy.deepcopy(base), learning_rate=1e-3, microbatch_size=5, value_clip=10.0)
    split = CriticWorker(copy.deepcopy(base), learning_rate=1e-3, microbatch_size=2, value_clip=10.0)
    assert whole.train(samples, returns, old) == pytest.approx(split.train(samples, returns, old), rel=1e-5)
    for a, b in zip(whole.model.parameters(), split.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="one number per response token"):
        whole.train(samples[:1], [(1.0,) * 9], [(0.0,) * 9])


def reward_sample(text, truth, prompt="What is 2+2?"):
    return Sample(Prompt("p", 0, (5,), prompt, ground_truth=truth), 0, (5,), (-1.0,), "stop", text, 0)


async def test_reward_over_grpc_equals_rewards_score():
    server = await serve(0, RewardServicer(RewardWorker(None)))  # no type configured: the built-ins
    client = GrpcRewardClient(f"127.0.0.1:{server.port}", "reward-0")
    local = LocalRewardClient(RewardWorker(None))
    try:
        assert isinstance(client, RewardClient)
        samples = [
            reward_sample("so \\boxed{4}", "4"),
            reward_sample("\\boxed{5}", "4"),
            reward_sample("no box at all", "4"),
            reward_sample("\\boxed{\\frac{1}{2}}", "0.5"),
            reward_sample("<think>2+2</think><answer>4</answer>", "4"),
            reward_sample("\x00\ufffd" * 50, "4"),
        ]
        for kind in ("boxed", "think_answer_tags"):
            got = await client.score(samples, kind)
            want = [score(kind, s.text, s.prompt.ground_truth, prompt=s.prompt.text) for s in samples]
            assert got == [(w.score, w.reason) for w in want]
            assert got == await local.score(samples, kind)
        assert (await client.score(samples[:1], "boxed"))[0] == (1.0, "correct")
        with pytest.raises(WorkerFailure, match="'no_such_reward' is not a reward type of this job"):
            await client.score(samples[:1], "no_such_reward")  # refused whole, nothing scored
        assert (await local.score(samples[:1], "no_such_reward"))[0][0] == 0.0
    finally:
        await client.close()
        await server.stop(None)


async def test_reward_model_scores_through_the_worker():
    model, tok = load_sequence_classifier(ModelSpec(tiny=TINY))
    scorer = RewardModelScorer(model, tok, batch_size=2)
    worker = RewardWorker("reward_model", scorer)
    server = await serve(0, RewardServicer(worker))
    client = GrpcRewardClient(f"127.0.0.1:{server.port}", "rm-0")
    try:
        samples = [reward_sample(t, "") for t in ("four", "it is 4", "banana")]
        got = await client.score(samples, "reward_model")
        want = scorer.score([s.prompt.text for s in samples], [s.text for s in samples])
        assert [g[0] for g in got] == pytest.approx(want, abs=1e-6)
        assert len(set(want)) == 3
        no_scorer = RewardWorker("reward_model")  # misconfigured: zero with a reason, never a crash
        assert all(s == 0.0 and "scorer" in r for s, r in no_scorer.score(samples))
    finally:
        await client.close()
        await server.stop(None)
