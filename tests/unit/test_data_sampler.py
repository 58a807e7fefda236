"""PromptSampler: determinism, exact resume from (epoch, offset), and data-parallel sharding,
checked against a slow reference that lays out the whole sequence of batches up front.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import itertools
import json

import pytest

from decentralized_verl.data import PromptSampler, epoch_order
from decentralized_verl.errors import DataError


def reference_batches(n: int, batch_size: int, seed: int, drop_last: bool, epochs: int) -> list[list[int]]:
    """Epoch by epoch: the epoch's permutation cut into consecutive batches; a short tail is kept
    unless drop_last."""
    out = []
    for epoch in range(epochs):
        order = epoch_order(n, seed, epoch)
        for start in range(0, n, batch_size):
            batch = order[start : start + batch_size]
            if len(batch) < batch_size and drop_last:
                break
            out.append(batch)
    return out


def take(sampler: PromptSampler, k: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(k)]


@pytest.mark.parametrize(
    ("n", "bs", "drop_last"), [(10, 3, False), (10, 3, True), (12, 4, False), (5, 5, True), (7, 10, False)]
)
def test_matches_reference(n: int, bs: int, drop_last: bool) -> None:
    expected = reference_batches(n, bs, seed=11, drop_last=drop_last, epochs=4)
    sampler = PromptSampler(n, bs, seed=11, drop_last=drop_last)
    assert take(sampler, len(expected)) == expected
    per_epoch = len(expected) // 4
    assert sampler.batches_per_epoch == per_epoch
    assert sampler.state() == {"epoch": 4, "offset": 0}


def test_each_epoch_is_a_permutation_and_epochs_differ() -> None:
    sampler = PromptSampler(20, 6, seed=3)
    epochs = [list(itertools.chain.from_iterable(take(sampler, 4))) for _ in range(3)]
    for items in epochs:
        assert sorted(items) == list(range(20))
    assert epochs[0] != epochs[1] != epochs[2]


def test_drop_last_batches_are_full_and_distinct_within_an_epoch() -> None:
    sampler = PromptSampler(10, 4, seed=0, drop_last=True)
    for _ in range(3):
        a, b = take(sampler, 2)
        assert len(a) == len(b) == 4 and not set(a) & set(b)


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    a = take(PromptSampler(50, 8, seed=5), 20)
    assert a == take(PromptSampler(50, 8, seed=5), 20)
    assert a != take(PromptSampler(50, 8, seed=6), 20)


def test_no_shuffle_is_file_order() -> None:
    assert take(PromptSampler(5, 2, shuffle=False), 4) == [[0, 1], [2, 3], [4], [0, 1]]


@pytest.mark.parametrize(
    ("n", "bs", "drop_last"), [(10, 3, False), (10, 3, True), (9, 3, False), (4, 8, False)]
)
def test_restored_sampler_continues_with_the_same_batches(n: int, bs: int, drop_last: bool) -> None:
    total = 15
    expected = take(PromptSampler(n, bs, seed=42, drop_last=drop_last), total)
    for stop in range(total):
        original = PromptSampler(n, bs, seed=42, drop_last=drop_last)
        before = take(original, stop)
        saved = json.loads(json.dumps(original.state()))  # as a checkpoint stores it
        assert set(saved) == {"epoch", "offset"}
        restored = PromptSampler(n, bs, seed=42, drop_last=drop_last)
        restored.load_state(saved)
        assert before + take(restored, total - stop) == expected, stop
        assert take(original, total - stop) == expected[stop:]


def test_state_offset_counts_items_so_a_new_batch_size_continues_at_the_same_item() -> None:
    original = PromptSampler(12, 4, seed=1)
    take(original, 2)
    assert original.state() == {"epoch": 0, "offset": 8}
    resized = PromptSampler(12, 2, seed=1)
    resized.load_state(original.state())
    order = epoch_order(12, 1, 0)
    assert take(resized, 3) == [order[8:10], order[10:12], epoch_order(12, 1, 1)[0:2]]


def test_state_at_an_epoch_end_points_at_the_next_epoch() -> None:
    sampler = PromptSampler(6, 3, seed=0)
    take(sampler, 2)
    assert sampler.state() == {"epoch": 1, "offset": 0}
    tail = PromptSampler(7, 3, seed=0, drop_last=True)
    take(tail, 2)
    assert tail.state() == {"epoch": 1, "offset": 0}  # the 1-item tail is dropped


@pytest.mark.parametrize(("n", "bs", "world"), [(16, 4, 2), (10, 4, 4), (10, 6, 3), (5, 8, 4), (3, 4, 4)])
def test_shards_partition_the_global_batch(n: int, bs: int, world: int) -> None:
    coordinator = PromptSampler(n, bs, seed=9)
    ranks = [PromptSampler(n, bs, seed=9, rank=r, world_size=world) for r in range(world)]
    for _ in range(12):
        epoch_before = coordinator.state()["epoch"]
        global_batch = coordinator.next_global_batch()
        shards = [s.next_batch() for s in ranks]
        assert len({len(s) for s in shards}) == 1 and shards[0], shards  # equal, non-empty
        joined = list(itertools.chain.from_iterable(shards))
        assert joined[: len(global_batch)] == global_batch
        padding = joined[len(global_batch) :]
        assert len(padding) < world
        order = epoch_order(n, 9, epoch_before)
        assert padding == [order[i % n] for i in range(len(padding))]  # filled from the epoch's start
        if len(global_batch) == bs:
            assert padding == [] and len(set(joined)) == len(joined)
        assert all(s.state() == coordinator.state() for s in ranks)


def test_sharded_resume() -> None:
    original = PromptSampler(30, 6, seed=2, rank=1, world_size=3)
    expected = take(original, 10)
    first = PromptSampler(30, 6, seed=2, rank=1, world_size=3)
    take(first, 4)
    restored = PromptSampler(30, 6, seed=2, rank=1, world_size=3)
    restored.load_state(first.state())
    assert take(restored, 6) == expected[4:]


def test_iterating_yields_forever() -> None:
    sampler = PromptSampler(3, 2, seed=0)
    assert list(itertools.islice(sampler, 5)) == reference_batches(3, 2, 0, False, 3)[:5]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"epoch": 0}, r"sampler state: offset: expected an integer >= 0 \(got None\)"),
        ({"epoch": -1, "offset": 0}, r"sampler state: epoch: expected an integer >= 0 \(got -1\)"),
        ({"epoch": "1", "offset": 0}, r"sampler state: epoch: expected an integer >= 0 \(got '1'\)"),
        ({"epoch": 0, "offset": True}, r"sampler state: offset: expected an integer >= 0 \(got True\)"),
        ({"epoch": 0, "offset": 11}, r"sampler state: offset: 11 is past the end of the data \(10 items\)"),
        ([0, 0], r"sampler state: epoch"),
    ],
)
def test_bad_state(state: object, message: str) -> None:
    sampler = PromptSampler(10, 2)
    with pytest.raises(DataError, match=message):
        sampler.load_state(state)  # type: ignore[arg-type]
    assert sampler.state() == {"epoch": 0, "offset": 0}  # untouched


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_items": 0, "batch_size": 1}, "n_items: must be >= 1"),
        ({"n_items": 4, "batch_size": 0}, "batch_size: must be >= 1"),
        ({"n_items": 4, "batch_size": 2, "rank": 2, "world_size": 2}, "rank: must be in 0..1"),
        ({"n_items": 4, "batch_size": 3, "world_size": 2}, "batch_size: must be divisible by world_size 2"),
        ({"n_items": 3, "batch_size": 4, "drop_last": True}, "leaves no batch with drop_last"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PromptSampler(**kwargs)
