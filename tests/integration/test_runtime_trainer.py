"""Sample collation, algorithm-blind updates, and data-parallel learners staying bit-identical (gloo)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spec.manifest import parse_job
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
from decentralized_verl.training.trainer import PolicyTrainer
from tests.support.processes import free_port, leave_group

JOB = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "t"},
    "spec": {
        "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "x.jsonl"},
        "roles": {"rollout": {"replicas": 1, "batchSize": 4}, "learner": {"replicas": 1}},
        "training": {"batchSize": 2, "minibatchSize": 2, "microbatchSize": 1, "learningRate": 0.01},
    },
}


def spec_with(**training):
    doc = {**JOB, "spec": {**JOB["spec"], "training": {**JOB["spec"]["training"], **training}}}
    return parse_job(doc).spec


def make_samples(model, n_prompts=2, n=2, seed=0):
    torch.manual_seed(seed)
    samples = []
    for g in range(n_prompts):
        prompt = tuple(torch.randint(5, 90, (3 + g,)).tolist())
        for k in range(n):
            response = tuple(torch.randint(5, 90, (2 + k + g,)).tolist())
            with torch.no_grad():
                ids = torch.tensor([prompt + response])
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            samples.append(
                Sample(
                    Prompt(f"p{g}", g, prompt, ""),
                    k,
                    response,
                    tuple(lp.tolist()),
                    "stop",
                    "",
                    0,
                    score=float(k == 0),
                )
            )
    return samples


@pytest.fixture(scope="module")
def tiny():
    spec = spec_with()
    model, tokenizer = load_model_and_tokenizer(spec.model)
    return spec, model, tokenizer


def test_collate_aligns_responses_and_logprobs_match_unpadded(tiny):
    _, model, tokenizer = tiny
    samples = make_samples(model)
    batch = collate(samples, tokenizer.pad_token_id)
    p = batch.prompt_length
    for i, s in enumerate(samples):
        assert batch.input_ids[i, p - len(s.prompt.token_ids) : p].tolist() == list(s.prompt.token_ids)
        assert batch.input_ids[i, p : p + len(s.response_ids)].tolist() == list(s.response_ids)
        assert batch.response_mask[i].sum() == len(s.response_ids)
    with torch.no_grad():
        logp = response_logprobs(model, batch)[0]
    for i, s in enumerate(samples):
        got = logp[i, : len(s.response_ids)]
        assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4), (got, s.logprobs)
        assert torch.all(logp[i, len(s.response_ids) :] == 0)


def test_update_raises_logprob_of_rewarded_samples(tiny):
    spec, model, tokenizer = tiny
    model = __import__("copy").deepcopy(model)
    samples = make_samples(model)
    batch = collate(samples, tokenizer.pad_token_id)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    assert torch.all(batch.advantages[batch.scores > 0.5].sum(1) > 0)
    trainer = PolicyTrainer(model, spec)
    before = batch.old_logprobs.clone()
    first = trainer.update(batch)
    for _ in range(4):
        metrics = trainer.update(batch)
    with torch.no_grad():
        after = response_logprobs(model, batch)[0]
    good = batch.scores > 0.5
    gain = ((after - before) * batch.response_mask).sum(1)
    assert torch.all(gain[good] > 0) and torch.all(gain[~good] < 0)
    assert first["grad_norm"] > 0 and trainer.updates == 5
    assert metrics["pg_clip_frac"] > 0  # by the fifth pass PPO's clip is holding the update back


def test_dapo_settings_take_the_presets_filters_when_the_spec_names_none() -> None:
    """A `dapo` job that leaves dynamicFilter and overlong out gets the preset's: both on, with the spec's
    default band and a quarter of maxNewTokens as the overlong cache."""
    doc = {**JOB, "spec": {**JOB["spec"], "algorithm": {"name": "dapo", "samplesPerPrompt": 2}}}
    spec = parse_job(doc).spec
    settings = AlgorithmSettings.from_spec(spec)
    quarter = max(1, spec.data.max_new_tokens // 4)
    assert (settings.dynamic_filter, settings.overlong) == ((0.01, 0.99), (quarter, 1.0))
    assert settings.mask_truncated and settings.clip_high == 0.28


def _ddp_worker(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    spec = spec_with()
    model, tokenizer = load_model_and_tokenizer(spec.model)
    if rank == 1:  # start from different weights: DDP must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
    trainer = PolicyTrainer(model, spec, distributed=True)
    samples = make_samples(model, seed=rank)  # each rank its own shard
    batch = collate(samples, tokenizer.pad_token_id)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    trainer.update(batch)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    queue.put((rank, flat.numpy().tobytes()))
    leave_group(queue)


def test_two_gloo_learners_end_a_step_with_identical_weights():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    spec = spec_with()
    fresh, _ = load_model_and_tokenizer(spec.model)
    initial = torch.cat([p.detach().flatten() for p in fresh.parameters()]).numpy().tobytes()
    assert results[0] != initial  # they trained
