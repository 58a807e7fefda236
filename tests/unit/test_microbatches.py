"""Mini/micro-batch planning: whole groups together, token-budget packing, and the same loss and gradient
however a mini-batch is cut."""

from __future__ import annotations

import copy

import pytest
import torch

from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import parse_job
from decentralized_verl.training import microbatches as mb
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
from decentralized_verl.training.trainer import PolicyTrainer


def group(rows, prompt, responses) -> mb.Group:
    return mb.Group(tuple(rows), prompt, tuple(responses))


def test_cost_counts_a_shared_prompt_once_and_pads_to_the_longest() -> None:
    g1, g2 = group([0, 1, 2], 10, [3, 5, 4]), group([3, 4], 7, [2, 2])
    assert mb.cost([g1]) == 10 + 3 * 4
    assert mb.cost([g1, g2]) == 2 * 10 + 5 * 4
    assert mb.cost([group([0], 6, [3]), group([1], 4, [2])]) == 2 * (6 + 3)  # no repeats: plain pass
    assert mb.cost([]) == 0


def test_groups_of_keeps_rows_of_a_prompt_together_in_first_seen_order() -> None:
    groups = mb.groups_of(
        torch.tensor([2, 0, 2, 0, 1]), torch.tensor([5, 3, 5, 3, 4]), torch.tensor([1, 2, 3, 4, 5])
    )
    assert [g.rows for g in groups] == [(0, 2), (1, 3), (4,)]
    assert [g.prompt_length for g in groups] == [5, 3, 4]
    assert groups[0].response_lengths == (1, 3)


@pytest.mark.parametrize("budget", [12, 30, 64, 1000])
def test_token_packing_covers_every_row_once_within_budget(budget: int) -> None:
    g = torch.Generator().manual_seed(budget)
    groups = []
    row = 0
    for _ in range(9):
        size = int(torch.randint(1, 6, (1,), generator=g))
        lengths = torch.randint(1, 20, (size,), generator=g).tolist()
        groups.append(group(range(row, row + size), int(torch.randint(3, 12, (1,), generator=g)), lengths))
        row += size
    parts = mb.by_tokens(groups, budget)
    rows = sorted(r for part in parts for r in mb.rows_of(part))
    assert rows == list(range(row))
    for part in parts:
        over = mb.cost(part) > budget
        assert not over or (len(part) == 1 and len(part[0].rows) == 1)  # only a lone row may not fit
    if budget >= 1000:
        assert len(parts) == 1


def test_an_oversized_group_is_split_into_chunks_that_fit() -> None:
    big = group(range(8), 20, [10] * 8)
    parts = mb.by_tokens([big], 60)
    assert all(mb.cost(p) <= 60 for p in parts) and len(parts) > 1
    assert sorted(r for p in parts for r in mb.rows_of(p)) == list(range(8))


def test_minibatches_are_seeded_permutations_of_whole_groups() -> None:
    groups = [group([2 * i, 2 * i + 1], 4, [1, 1]) for i in range(6)]
    a = mb.minibatches(groups, 2, torch.Generator().manual_seed(1))
    b = mb.minibatches(groups, 2, torch.Generator().manual_seed(1))
    assert a == b and [len(x) for x in a] == [2, 2, 2]
    assert sorted(g.rows for x in a for g in x) == sorted(g.rows for g in groups)


def test_loss_weights_are_each_parts_share_of_the_normaliser() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.float32)
    assert mb.loss_weights(mask, [[0, 1], [2, 3]], "token_mean") == pytest.approx([4 / 6, 2 / 6])
    assert mb.loss_weights(mask, [[0, 1], [2, 3]], "seq_mean_token_mean") == pytest.approx([2 / 3, 1 / 3])
    assert mb.loss_weights(torch.zeros(2, 2), [[0], [1]], "token_mean") == [0.5, 0.5]


JOB = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "t"},
    "spec": {
        "model": {"tiny": {"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
        "data": {"train": "x.jsonl"},
        "roles": {"rollout": {"replicas": 1, "batchSize": 4}, "learner": {"replicas": 1}},
        "training": {"batchSize": 4, "minibatchSize": 4, "learningRate": 0.001, "maxGradNorm": 1e9},
    },
}


def spec_with(training: dict, algorithm: dict):
    spec = copy.deepcopy(JOB)
    spec["spec"]["training"].update(training)
    spec["spec"]["algorithm"].update(algorithm)
    return parse_job(spec).spec


def batch_for(spec, model, tokenizer):
    g = torch.Generator().manual_seed(0)
    samples = []
    for p in range(4):
        prompt = tuple(torch.randint(5, 90, (3 + 2 * p,), generator=g).tolist())
        for k in range(4):
            n = int(torch.randint(1, 12, (1,), generator=g))
            response = tuple(torch.randint(5, 90, (n,), generator=g).tolist())
            old = tuple((torch.randn(n, generator=g) * 0.1 - 2).tolist())
            samples.append(
                Sample(Prompt(f"p{p}", p, prompt, ""), k, response, old, "stop", "", 0, score=float(k % 2))
            )
    batch = collate(samples, tokenizer.pad_token_id)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    return batch


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_same_gradient_whole_minibatch_by_rows_and_by_tokens(aggregation: str) -> None:
    from decentralized_verl.models.loading import load_model_and_tokenizer

    algorithm = {"lossAggregation": aggregation, "entropyCoef": 0.01}
    base, tokenizer = load_model_and_tokenizer(spec_with({}, algorithm).model)
    gradients = {}
    for name, training in {
        "whole": {"microbatchSize": 4},
        "rows": {"microbatchSize": 1},
        "tokens": {"microbatchTokens": 24},
    }.items():
        spec = spec_with(training, algorithm)
        model = copy.deepcopy(base)
        trainer = PolicyTrainer(model, spec)
        batch = batch_for(spec, model, tokenizer)
        parts = trainer.microbatch_plan(batch)
        assert len(parts) == 1  # one mini-batch, so the gradients left on the weights are all of it
        if name == "tokens":
            assert len(parts[0]) > 4  # the budget split groups
        trainer.generator.manual_seed(spec.training.seed + 17)
        metrics = trainer.update(batch)
        assert metrics["grad_norm"] > 0
        gradients[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    for name in ("rows", "tokens"):
        diff = (gradients[name] - gradients["whole"]).norm() / gradients["whole"].norm()
        assert diff < 1e-5, (name, float(diff))


def test_microbatch_size_and_tokens_together_is_a_spec_error() -> None:
    with pytest.raises(ManifestError, match=r"spec\.training\.microbatchTokens: set either .* not both"):
        spec_with({"microbatchSize": 2, "microbatchTokens": 100}, {})
    with pytest.raises(ManifestError, match=r"spec\.training\.microbatchTokens: must be > 0 \(got 0\)"):
        spec_with({"microbatchTokens": 0}, {})
