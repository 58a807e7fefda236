"""DAPO filters (dynamic sampling, overlong punishment, truncation mask) and seed 002's top-k selection."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.algorithms.filters import (
    dynamic_sampling_keep_mask,
    mask_truncated,
    overlong_penalty,
    top_k_indices,
    top_k_keep_mask,
)


def random_groups(batch: int, gen: torch.Generator, min_size: int = 1) -> torch.Tensor:
    sizes: list[int] = []
    while sum(sizes) < batch:
        sizes.append(int(torch.randint(min_size, 6, (1,), generator=gen)))
    sizes[-1] -= sum(sizes) - batch
    ids = [11 * g - 5 for g, size in enumerate(sizes) for _ in range(size) if size > 0]
    return torch.tensor(ids)[torch.randperm(batch, generator=gen)]


# ---------------------------------------------------------------- dynamic sampling


def ref_dynamic(successes, groups, lo, hi, inclusive):
    keep = []
    for i in range(len(groups)):
        group = [float(successes[j]) for j in range(len(groups)) if groups[j] == groups[i]]
        rate = sum(group) / len(group)
        keep.append(lo <= rate <= hi if inclusive else lo < rate < hi)
    return torch.tensor(keep)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("lo", "hi", "inclusive"), [(0.0, 1.0, False), (0.25, 0.75, True), (0.2, 0.9, False)]
)
def test_dynamic_sampling_matches_loop(seed, lo, hi, inclusive):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(2, 30, (1,), generator=gen))
    groups = random_groups(batch, gen)
    # success probability per group in {0, 0.5, 1} so all-fail and all-pass groups occur
    p = torch.tensor([0.0, 0.5, 1.0])[torch.randint(0, 3, (batch,), generator=gen)]
    successes = torch.rand(batch, generator=gen) < p
    for values in (successes, successes.double()):
        keep = dynamic_sampling_keep_mask(values, groups, min_rate=lo, max_rate=hi, inclusive=inclusive)
        assert torch.equal(keep, ref_dynamic(successes, groups, lo, hi, inclusive))


def test_dynamic_sampling_hand_worked():
    successes = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep = dynamic_sampling_keep_mask(successes, groups)
    assert keep.tolist() == [False, False, True, True, False, False, True, True]


def test_dynamic_sampling_bad_inputs():
    with pytest.raises(ValueError, match="successes"):
        dynamic_sampling_keep_mask(torch.ones(3), torch.zeros(4).long())
    with pytest.raises(ValueError, match="min_rate"):
        dynamic_sampling_keep_mask(torch.ones(2), torch.zeros(2).long(), min_rate=0.8, max_rate=0.2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dynamic_sampling_keep_mask(torch.tensor([2.0, 0.0]), torch.zeros(2).long())


# ---------------------------------------------------------------- overlong punishment


def ref_overlong(length, max_length, cache):
    if length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return (max_length - cache - length) / cache
    return -1.0


def test_overlong_hand_worked():
    lengths = torch.tensor([0, 16, 17, 18, 20, 21, 500])
    out = overlong_penalty(lengths, max_length=20, cache_length=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]))


@pytest.mark.parametrize(("max_length", "cache"), [(20, 4), (7, 7), (100, 1), (33, 10)])
def test_overlong_matches_loop(max_length, cache):
    lengths = torch.arange(0, max_length + 5)
    out = overlong_penalty(lengths, max_length=max_length, cache_length=cache)
    expected = torch.tensor([ref_overlong(int(n), max_length, cache) for n in lengths], dtype=torch.float32)
    torch.testing.assert_close(out, expected)
    assert bool((out[1:] <= out[:-1]).all()), "the penalty never rises with length"


def test_overlong_bad_inputs():
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), max_length=10, cache_length=0)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), max_length=10, cache_length=11)
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(torch.tensor([1.5]), max_length=10, cache_length=2)


# ---------------------------------------------------------------- truncated responses


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64])
def test_mask_truncated(dtype):
    gen = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 5, generator=gen) < 0.6).to(dtype)
    truncated = torch.tensor([True, False, False, True, False, True])
    out = mask_truncated(mask, truncated)
    assert out.dtype == dtype
    for b in range(6):
        expected = torch.zeros_like(mask[b]) if truncated[b] else mask[b]
        assert torch.equal(out[b], expected)
    assert torch.equal(mask_truncated(mask, truncated.long()), out)


def test_mask_truncated_bad_inputs():
    with pytest.raises(ValueError, match="truncated"):
        mask_truncated(torch.ones(2, 3), torch.tensor([True]))
    with pytest.raises(ValueError, match="truncated"):
        mask_truncated(torch.ones(2, 3), torch.tensor([2, 0]))


# ---------------------------------------------------------------- top-k


def ref_top_k(scores, groups, k):
    keep = [False] * len(scores)
    for g in set(groups.tolist()):
        idx = [i for i in range(len(scores)) if groups[i] == g]
        # best first; among equal scores the earlier sample first
        idx.sort(key=lambda i: (-float(scores[i]), i))
        for i in idx[:k]:
            keep[i] = True
    return torch.tensor(keep)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_top_k_matches_loop(seed, k):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 40, (1,), generator=gen))
    groups = random_groups(batch, gen)
    scores = torch.randint(0, 4, (batch,), generator=gen).float()  # many ties on purpose
    keep = top_k_keep_mask(scores, groups, k)
    expected = ref_top_k(scores, groups, k)
    assert torch.equal(keep, expected)
    assert torch.equal(top_k_indices(scores, groups, k), torch.nonzero(expected).squeeze(1))


def test_top_k_hand_worked():
    scores = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0, 9.0])
    groups = torch.tensor([4, 4, 4, 4, 1, 1])
    assert top_k_keep_mask(scores, groups, 2).tolist() == [True, False, True, False, True, True]
    assert top_k_indices(scores, groups, 1).tolist() == [0, 5]


def test_top_k_bad_inputs():
    with pytest.raises(ValueError, match="k must be"):
        top_k_keep_mask(torch.zeros(3), torch.zeros(3).long(), 0)
    with pytest.raises(ValueError, match="scores"):
        top_k_keep_mask(torch.zeros(2), torch.zeros(3).long(), 1)
