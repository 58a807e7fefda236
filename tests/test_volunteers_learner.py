"""Two volunteer learners (separate processes) average gradients with hivemind and end each step identical.

Each learner has its own shard of the data; after two steps both hold the parameters of two SGD steps on
the *averaged* gradient, computed here independently in-process as the reference. hivemind's all-reduce
alone leaves peers a few float32 ulps apart (`local + (average - local)`); the learners reconcile after
every step (the group's leader's bytes win), so the two parameter files must be byte-identical. A learner
that stepped on its own gradient differs from the reference by far more than the tolerance, so the test
fails if averaging does not happen.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.support.local_models import save_tiny_model
from tests.support.processes import console_env, free_port

pytestmark = pytest.mark.usefixtures("collected_before_fork")

LR = 0.1
BATCH = 4
STEPS = 2


def reference_steps(model_dir: Path, data: Path, steps: int, shards: tuple[int, ...]) -> dict:
    """Parameters after `steps` plain SGD steps on the mean gradient of `shards`' batches, in-process."""
    from decentralized_verl.entrypoints.volunteer_learner import batch_for_step, lm_loss, read_pairs, shard_of
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec

    pairs = read_pairs(str(data))
    model, tokenizer = load_model_and_tokenizer(ModelSpec(path=str(model_dir)), padding_side="right")
    model.train()
    for step in range(steps):
        grads = []
        for shard in shards:
            model.zero_grad(set_to_none=True)
            lm_loss(model, tokenizer, batch_for_step(shard_of(pairs, shard, 2), step, BATCH)).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= LR * sum(g[n] for g in grads) / len(grads)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def test_two_volunteer_learners_end_the_step_with_the_same_parameters(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = save_tiny_model(tmp_path / "tiny")
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n"
            for a in range(4)
            for b in range(4)
        )
    )
    port = free_port()
    logs = {name: (tmp_path / f"{name}.log").open("w+") for name in ("dht", "l0", "l1")}
    procs = [
        subprocess.Popen(
            ["dverl-dht", "--port", str(port), "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}"],
            stdout=logs["dht"],
            stderr=subprocess.STDOUT,
            env=console_env(),
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"--initial-peers (\S+)", (tmp_path / "dht.log").read_text())):
            assert time.monotonic() < deadline, (tmp_path / "dht.log").read_text()
            time.sleep(0.2)
        maddr = found.group(1)
        for shard in (0, 1):
            cmd = (
                f"dverl worker --role learner --initial-peers {maddr} --job learners --model {model} "
                f"--data {data} --shard {shard} --num-shards 2 --peers 2 --steps {STEPS} "
                f"--batch-size {BATCH} --learning-rate {LR} --digest-out {tmp_path}/l{shard}.json"
            )
            procs.append(
                subprocess.Popen(
                    cmd.split(), stdout=logs[f"l{shard}"], stderr=subprocess.STDOUT, env=console_env()
                )
            )
        for proc, name in zip(procs[1:], ("l0", "l1"), strict=True):
            assert proc.wait(300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)

    results = [json.loads((tmp_path / f"l{i}.json").read_text()) for i in (0, 1)]
    assert [r["epoch"] for r in results] == [STEPS, STEPS]
    # every step was averaged by a group of both learners (never alone)
    assert [r["peers_per_step"] for r in results] == [[2] * STEPS, [2] * STEPS]
    assert results[0]["peer_id"] != results[1]["peer_id"]
    leader = min(r["peer_id"] for r in results)
    for r in results:  # both name the same leader every step; only the follower fetched chunks
        assert [s["leader"] for s in r["sync"]] == [leader] * STEPS
        if r["peer_id"] == leader:
            assert all(s["fetched"] == 0 for s in r["sync"])
    assert all(re.fullmatch(r"[0-9a-f]{64}", r["sha256"]) for r in results)
    assert results[0]["sha256"] == results[1]["sha256"]
    states = [load_file(str(tmp_path / f"l{i}.json.safetensors")) for i in (0, 1)]
    assert states[0].keys() == states[1].keys()
    for name in states[0]:  # bit for bit, not within a tolerance
        assert torch.equal(states[0][name].view(torch.uint8), states[1][name].view(torch.uint8)), name
    averaged = reference_steps(model, data, STEPS, (0, 1))
    alone = reference_steps(model, data, STEPS, (0,))
    assert max_diff(states[0], averaged) < 1e-6
    assert max_diff(alone, averaged) > 1e-3  # stepping on one shard's gradient would be caught


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


def test_a_lone_learner_refuses_to_step_when_peers_are_expected() -> None:
    import hivemind
    from hivemind.optim.grad_averager import GradientAverager

    from decentralized_verl.errors import VolunteerError
    from decentralized_verl.volunteers.averaging import average_with_group

    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    averager = None
    try:
        layer = torch.nn.Linear(4, 2)
        layer(torch.ones(1, 4)).sum().backward()
        averager = GradientAverager(
            layer.parameters(),
            dht=dht,
            prefix="lone-learner",
            start=True,
            min_group_size=2,
            target_group_size=2,
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            warn=False,
        )
        averager.accumulate_grads_(1)
        began = time.monotonic()
        with pytest.raises(VolunteerError, match=r"could not average with 2 learners .*step alone"):
            average_with_group(
                averager,
                job="j",
                epoch=0,
                peers=2,
                weight=1,
                round_timeout_s=2.0,
                allreduce_timeout_s=2.0,
                deadline_s=5.0,
            )
        assert time.monotonic() - began < 30
    finally:
        if averager is not None:
            averager.shutdown()
        dht.shutdown()
