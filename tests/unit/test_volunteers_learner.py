"""Two volunteer learners (separate processes) average gradients with hivemind and end each step identical.

Each learner has its own shard of the data; after two steps both hold the parameters of two SGD steps on
the *averaged* gradient, computed here independently in-process as the reference. hivemind's all-reduce
alone leaves peers a few float32 ulps apart (`local + (average - local)`); the learners reconcile after
every step (the group's leader's bytes win), so the two parameter files must be byte-identical. A learner
that stepped on its own gradient differs from the reference by far more than the tolerance, so the test
fails if averaging does not happen.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import pytest
import torch


def test_learner_shards_are_disjoint_and_cover_the_data() -> None:
    from decentralized_verl.entrypoints.volunteer_learner import batch_for_step, shard_of
    from decentralized_verl.errors import VolunteerError

    items = list(range(10))
    shards = [shard_of(items, i, 3) for i in range(3)]
    assert sorted(x for s in shards for x in s) == items
    assert batch_for_step([1, 2, 3], 1, 2) == [3, 1]
    with pytest.raises(VolunteerError, match="--shard"):
        shard_of(items, 3, 3)
    with pytest.raises(VolunteerError, match="empty"):
        shard_of([1], 1, 2)


def test_parameter_sync_fetches_only_differing_chunks_and_checks_them() -> None:
    from decentralized_verl.errors import VolunteerError
    from decentralized_verl.volunteers.param_sync import (
        byte_views,
        chunk_bytes_of,
        chunk_digests,
        chunk_layout,
        differing,
        write_chunk,
    )

    leader = [torch.linspace(-1, 1, 300), torch.arange(10, dtype=torch.float32)]
    follower = [t.clone() for t in leader]
    follower[0][250] = torch.nextafter(follower[0][250], torch.tensor(2.0))  # one ulp off, like all-reduce
    lv, fv = byte_views(leader), byte_views(follower)
    layout = chunk_layout(lv, chunk_bytes=256)  # 1200 bytes -> 5 chunks, 40 bytes -> 1 chunk
    assert layout == [(0, 0, 256), (0, 256, 512), (0, 512, 768), (0, 768, 1024), (0, 1024, 1200), (1, 0, 40)]
    theirs = chunk_digests(lv, layout)
    todo = differing(chunk_digests(fv, layout), theirs)
    assert todo == [3]  # float 250 lives in bytes 1000..1004
    with pytest.raises(VolunteerError, match="digest mismatch"):
        write_chunk(fv, layout[3], b"\0" * 256, theirs[3])
    with pytest.raises(VolunteerError, match="bytes received"):
        write_chunk(fv, layout[3], b"\0" * 10, theirs[3])
    write_chunk(fv, layout[3], chunk_bytes_of(lv, layout[3]), theirs[3])
    assert all(torch.equal(a, b) for a, b in zip(leader, follower, strict=True))  # written in place
    with pytest.raises(VolunteerError, match="layouts differ"):
        differing(theirs, theirs[:-1])


def test_average_fingerprint_catches_a_failed_all_reduce_part() -> None:
    from decentralized_verl.volunteers.averaging import check_average, fingerprint

    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(4096, generator=gen), torch.randn(64, generator=gen)] for _ in range(3)]
    weights = [4.0, 4.0, 8.0]
    mean = [sum(w * g[i] for w, g in zip(weights, grads, strict=True)) / sum(weights) for i in range(2)]
    members = [(w, fingerprint(g, seed=7)) for w, g in zip(weights, grads, strict=True)]
    # what hivemind hands a peer: its local value plus the float32 delta, a few ulps off the mean
    rounded = [g + (m - g) for g, m in zip(grads[0], mean, strict=True)]
    assert check_average(fingerprint(rounded, seed=7), members) == []
    broken = [t.clone() for t in rounded]
    broken[0][:128] = grads[0][0][:128]  # one part kept its local values (a reducer failed)
    problems = check_average(fingerprint(broken, seed=7), members)
    assert len(problems) == 1 and problems[0].startswith("tensor 0:")
    alone = fingerprint(grads[0], seed=7)  # a learner that stepped on its own gradient
    assert len(check_average(alone, members)) == 2
    assert fingerprint(grads[0], seed=7) != fingerprint(grads[0], seed=8)  # per-step weights
