"""The trainer with a rollout correction: the learner recomputes its log-probs, the rollout's (behaviour)
log-probs set the weights and rejections, and the metrics report the mismatch; advantages whitening.

Samples are built the way a rollout backend hands them over (`Sample.logprobs` are the engine's own); the
vLLM engine's are stood in for by the tiny model's log-probs plus engine noise, or by an older policy's.
"""

from __future__ import annotations

import copy

import pytest
import torch

from decentralized_verl.algorithms.masking import masked_whiten
from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spec.manifest import parse_job
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
from decentralized_verl.training.trainer import PolicyTrainer

SPEC = {
    "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
    "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
    "data": {"train": "x.jsonl"},
    "roles": {"rollout": {"replicas": 1, "batchSize": 3}, "learner": {"replicas": 1}},
    "training": {"batchSize": 3, "minibatchSize": 3, "microbatchSize": 1, "learningRate": 0.01},
}


def spec_with(backend: str = "hf", **algorithm):
    spec = copy.deepcopy(SPEC)
    spec["roles"]["rollout"]["backend"] = backend
    spec["algorithm"].update(algorithm)
    return parse_job(
        {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "t"}, "spec": spec}
    ).spec


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model_and_tokenizer(spec_with().model)
    return model, tokenizer


def true_logprobs(model, prompt, response) -> list[float]:
    with torch.no_grad():
        ids = torch.tensor([prompt + response])
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).tolist()


def samples_from(model, noise: float = 0.0, seed: int = 0, n_prompts: int = 3, n: int = 2) -> list[Sample]:
    """Samples as a rollout engine returns them: its log-probs are `model`'s plus per-token noise."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for g in range(n_prompts):
        prompt = tuple(torch.randint(5, 90, (3 + g,), generator=gen).tolist())
        for k in range(n):
            response = tuple(torch.randint(5, 90, (3 + k + g,), generator=gen).tolist())
            lp = torch.tensor(true_logprobs(model, prompt, response))
            lp = lp + noise * torch.randn(lp.shape, generator=gen)
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


def batch_of(samples, tokenizer, spec):
    batch = collate(samples, tokenizer.pad_token_id)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    return batch


def test_vllm_backend_logprobs_get_truncated_importance_weights(tiny):
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    spec = spec_with("vllm")  # the vllm backend turns token-level TIS (cap 2) on by default
    samples = samples_from(model, noise=0.5)
    batch = batch_of(samples, tokenizer, spec)
    trainer = PolicyTrainer(model, spec)
    fixed, metrics = trainer.corrected(batch)

    mask = batch.response_mask.bool()
    with torch.no_grad():
        learner = response_logprobs(model, batch)[0]
    torch.testing.assert_close(fixed.old_logprobs[mask], learner[mask], atol=1e-5, rtol=0)
    expected = torch.exp(learner - batch.old_logprobs).clamp(max=2.0)
    torch.testing.assert_close(fixed.rollout_weights[mask], expected[mask], atol=1e-4, rtol=1e-4)
    assert torch.equal(fixed.loss_mask, batch.response_mask)  # no rejection by default
    gap = (learner - batch.old_logprobs).abs()[mask]
    assert metrics["rollout_corr_abs_log_ratio_mean"] == pytest.approx(float(gap.mean()), abs=1e-4)
    assert metrics["rollout_corr_abs_log_ratio_max"] == pytest.approx(float(gap.max()), abs=1e-4)
    assert 0 < metrics["rollout_corr_truncated_frac"] < 1 and metrics["rollout_corr_masked_frac"] == 0.0

    out = trainer.update(batch)
    assert out["rollout_corr_abs_log_ratio_mean"] == pytest.approx(metrics["rollout_corr_abs_log_ratio_mean"])
    # The loss's ratio is against the learner's own log-probs: 1 within the one optimizer step.
    assert out["pg_ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_hf_backend_trains_against_the_rollout_logprobs_unchanged(tiny):
    model, tokenizer = tiny
    spec = spec_with("hf")
    batch = batch_of(samples_from(model, noise=0.5), tokenizer, spec)
    trainer = PolicyTrainer(copy.deepcopy(model), spec)
    fixed, metrics = trainer.corrected(batch)
    assert fixed is batch and metrics == {}
    out = trainer.update(batch)
    assert not any(key.startswith("rollout_corr_") for key in out)
    assert abs(out["pg_ratio_mean"] - 1.0) > 1e-3  # the engine noise is in the ratio itself


def test_rejected_samples_leave_the_gradient_but_not_the_forward(tiny):
    """Sample 0's rollout log-probs are far off: sequence rejection drops it, so its advantage no longer
    moves the weights; the other samples' learner log-probs are still computed in full context."""
    model, tokenizer = tiny
    spec = spec_with(rolloutCorrection={"importanceSampling": "off", "rejection": "sequence"})
    samples = samples_from(model)
    samples[0] = samples[0].with_(logprobs=tuple(x - 3.0 for x in samples[0].logprobs))
    results = []
    for twist in (0.0, 50.0):
        batch = batch_of(samples, tokenizer, spec)
        batch.advantages[0] += twist * batch.response_mask[0]
        trainer = PolicyTrainer(copy.deepcopy(model), spec)
        fixed, metrics = trainer.corrected(batch)
        assert fixed.loss_mask[0].sum() == 0 and torch.equal(fixed.loss_mask[1:], batch.response_mask[1:])
        assert torch.equal(fixed.response_mask, batch.response_mask)
        assert metrics["rollout_corr_rejected_frac"] == pytest.approx(1 / 6)
        # Rejected tokens leave the loss's denominator too: the loss is that of the other samples alone.
        whole, _, _ = trainer._loss(fixed)
        others, _, _ = trainer._loss(fixed.select(torch.arange(1, len(samples))))
        torch.testing.assert_close(whole, others, atol=1e-6, rtol=1e-5)
        trainer.update(batch)
        results.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_stale_samples_compose_staleness_and_mismatch_in_the_correction(tiny):
    """Samples from the policy one update back: with the correction, rho = learner now / rollout then
    carries the staleness and the PPO ratio starts at 1; without it, the PPO ratio carries it."""
    model, tokenizer = tiny
    old_model = copy.deepcopy(model)
    newer = copy.deepcopy(model)
    plain_spec = spec_with()
    PolicyTrainer(newer, plain_spec).update(batch_of(samples_from(old_model, seed=5), tokenizer, plain_spec))
    stale = samples_from(old_model, seed=7)

    spec = spec_with(rolloutCorrection={"importanceSampling": "token", "cap": 5.0})
    batch = batch_of(stale, tokenizer, spec)
    mask = batch.response_mask.bool()
    with torch.no_grad():
        drift = (response_logprobs(newer, batch)[0] - batch.old_logprobs).abs()[mask]
    assert float(drift.mean()) > 1e-3  # the update moved the policy
    corrected = PolicyTrainer(copy.deepcopy(newer), spec).update(batch)
    assert corrected["rollout_corr_abs_log_ratio_mean"] == pytest.approx(float(drift.mean()), abs=1e-5)
    assert corrected["pg_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    uncorrected = PolicyTrainer(copy.deepcopy(newer), plain_spec).update(
        batch_of(stale, tokenizer, plain_spec)
    )
    assert abs(uncorrected["pg_ratio_mean"] - 1.0) > 1e-4


def test_whitened_advantages_have_mean_0_and_std_1_over_valid_tokens(tiny):
    model, tokenizer = tiny
    samples = samples_from(model)
    plain = batch_of(samples, tokenizer, spec_with())
    whitened = batch_of(samples, tokenizer, spec_with(whitenAdvantages=True))
    mask = plain.response_mask.bool()
    values = whitened.advantages[mask]
    assert float(values.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(values.std()) == pytest.approx(1.0, abs=1e-4)
    torch.testing.assert_close(whitened.advantages, masked_whiten(plain.advantages, mask))
    torch.testing.assert_close(whitened.returns, plain.returns)  # the critic's targets stay unwhitened
