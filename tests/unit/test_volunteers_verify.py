"""Verification of untrusted samples: the sampling rate, the comparison, and bad claims."""

from __future__ import annotations

import math
import random

import pytest

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.volunteers.verify import (
    Verifier,
    choose_for_check,
    compare_logprobs,
    compare_scores,
)


class TruthPolicy:
    """The trusted recomputation: here the honest log-probs are known exactly."""

    def logprobs(self, samples, version):
        return [tuple(-0.1 * (j + 1) for j in range(len(s.response_ids))) for s in samples]


def sample(i: int, cheat: bool = False, version: int = 3) -> Sample:
    honest = tuple(-0.1 * (j + 1) for j in range(4))
    return Sample(
        prompt=Prompt(f"p{i}", i, (1, 2), "q"),
        sample_index=0,
        response_ids=(5, 6, 7, 8),
        logprobs=tuple(x * 0.5 for x in honest) if cheat else honest,
        finish_reason="stop",
        text="",
        policy_version=version,
    )


def test_choose_for_check_sizes() -> None:
    rng = random.Random(0)
    assert choose_for_check(10, 0.0, rng) == []
    assert len(choose_for_check(10, 0.05, rng)) == 1  # at least one when the fraction is positive
    assert len(choose_for_check(10, 0.2, rng)) == 2
    assert choose_for_check(10, 1.0, rng) == list(range(10))
    assert choose_for_check(0, 0.5, rng) == []


@pytest.mark.parametrize("fraction", [0.125, 0.25, 0.5])
def test_detection_rate_matches_the_configured_fraction(fraction: float) -> None:
    """One forged sample in a batch of 8: caught with probability k/8 where k = ceil(fraction * 8)."""
    verifier = Verifier(TruthPolicy(), fraction=fraction, picks=random.Random(1))
    trials = 2000
    caught = 0
    for t in range(trials):
        batch = [sample(i, cheat=(i == t % 8)) for i in range(8)]
        caught += not verifier.check(batch, 3).ok
    expected = math.ceil(fraction * 8) / 8
    assert abs(caught / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_honest_batches_pass_and_wrong_versions_fail() -> None:
    verifier = Verifier(TruthPolicy(), fraction=1.0)
    assert verifier.check([sample(i) for i in range(5)], 3).ok
    result = verifier.check([sample(0, version=2)], 3)
    assert not result.ok and "claims policy v2, asked v3" in str(result.mismatches[0])


def test_compare_reports_the_worst_token_and_rejects_nan() -> None:
    assert compare_logprobs(("p", 0), (-1.0, -2.0), (-1.0, -2.001), atol=0.01) is None
    problem = compare_logprobs(("p", 0), (-1.0, -2.0), (-1.0, -2.5), atol=0.01)
    assert "token 1" in str(problem) and "0.5000" in str(problem)
    assert compare_logprobs(("p", 0), (float("nan"),), (-1.0,), atol=0.01) is not None
    assert "2 log-probs for 1 tokens" in str(compare_logprobs(("p", 0), (-1.0, -1.0), (-1.0,), 0.01))
    assert [m.key for m in compare_scores([("a", 0), ("b", 0)], [1.0, 0.0], [1.0, 1.0])] == [("b", 0)]


def test_recomputed_logprobs_match_the_hf_backend() -> None:
    """Honest log-probs from real generation pass the float32 tolerance: the check has no false alarms."""
    import torch

    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.spec.catalogue.backends import HF
    from decentralized_verl.volunteers.verify import DEFAULT_ATOL, model_logprobs

    torch.manual_seed(0)
    spec = ModelSpec.model_validate(
        {
            "tiny": {
                "hiddenSize": 32,
                "numLayers": 1,
                "numHeads": 2,
                "intermediateSize": 64,
                "maxPositions": 64,
            }
        }
    )
    model, tokenizer = load_model_and_tokenizer(spec)
    worker = RolloutWorker(make_backend(HF, model, tokenizer, seed=0), "w")
    items = [(Prompt(f"p{i}", i, tuple(range(3, 3 + 2 + i)), ""), 0) for i in range(4)]
    samples = list(worker.generate_sync(items, SamplingParams(max_new_tokens=6, temperature=1.0, seed=7), 0))
    recomputed = model_logprobs(model, samples, 1.0, tokenizer.pad_token_id)
    for s, values in zip(samples, recomputed, strict=True):
        assert compare_logprobs(s.key, s.logprobs, values, DEFAULT_ATOL["float32"]) is None


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 8, 1.0)],
    ids=["plain", "top-p", "top-k"],
)
def test_seeded_draws_replay_and_a_chosen_response_is_caught(
    temperature: float, top_k: int, top_p: float
) -> None:
    """A real hf backend's seeded samples replay exactly on the trusted side (no false alarms, with top-k,
    top-p and temperature); responses drawn with a seed the volunteer picked itself carry honest log-probs
    (the log-prob check passes them) but are not the draws of the assigned seed."""
    import dataclasses

    import torch

    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.spec.catalogue.backends import HF
    from decentralized_verl.volunteers.sampling_check import DEFAULT_TOL
    from decentralized_verl.volunteers.verify import PublishedPolicy

    torch.manual_seed(0)
    tiny = {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64, "maxPositions": 64}
    model, tokenizer = load_model_and_tokenizer(ModelSpec.model_validate({"tiny": tiny}))
    worker = RolloutWorker(make_backend(HF, model, tokenizer, seed=0), "w")
    items = [(Prompt(f"p{i}", i, tuple(range(3, 5 + i)), ""), j) for i in range(3) for j in range(2)]
    assigned = SamplingParams(max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    honest = list(worker.generate_sync(items, assigned, 0))
    chosen = list(worker.generate_sync(items, dataclasses.replace(assigned, seed=8), 0))

    class Policy(PublishedPolicy):
        def __init__(self) -> None:
            self.model, self.version, self.temperature = model, 0, temperature
            self.pad_token_id = tokenizer.pad_token_id
            import threading

            self._lock = threading.Lock()

    verifier = Verifier(Policy(), fraction=1.0, atol=0.02, draw_tol=DEFAULT_TOL["float32"])
    assert verifier.check(honest, 0, assigned).ok
    assert verifier.check(chosen, 0).ok  # without the request's seed, only log-probs: they are honest
    caught = verifier.check(chosen, 0, assigned)
    differs = [c for c, h in zip(chosen, honest, strict=True) if c.response_ids != h.response_ids]
    assert differs and len(caught.mismatches) == len(differs)
    assert all("not sampled from the policy with its seed" in m.what for m in caught.mismatches)


class PredictingCheater:
    """A volunteer that knows the job's `training.seed` (every volunteer gets the spec) and replays the
    picks a seeded verifier would make, forging only the samples it predicts go unchecked."""

    def __init__(self, seed: int, fraction: float) -> None:
        self.rng, self.fraction = random.Random(seed), fraction

    def batch(self, n: int) -> list[Sample]:
        picked = set(choose_for_check(n, self.fraction, self.rng))
        return [sample(i, cheat=i not in picked) for i in range(n)]


def test_picks_seeded_from_what_volunteers_know_are_predicted() -> None:
    """The attack, against the picks drawn from `training.seed`: 40 batches of forgeries, none caught."""
    seed, fraction = 42, 0.5
    seeded = Verifier(TruthPolicy(), fraction=fraction, picks=random.Random(seed))
    cheater = PredictingCheater(seed, fraction)
    results = [seeded.check(cheater.batch(8), 3) for _ in range(40)]
    assert all(r.ok for r in results) and seeded.rejected_batches == 0


def test_the_verifiers_own_picks_cannot_be_predicted() -> None:
    """The same cheater against the verifier as the job builds it: its first batch is caught unless the
    secret picks happen to match (1 in 70 per batch): 5 of 10 batches missed has a chance below 1e-8."""
    seed, fraction = 42, 0.5
    verifier = Verifier(TruthPolicy(), fraction=fraction)
    assert isinstance(verifier._rng, random.SystemRandom)
    cheater = PredictingCheater(seed, fraction)
    caught = sum(not verifier.check(cheater.batch(8), 3).ok for _ in range(10))
    assert caught >= 5
