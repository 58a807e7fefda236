"""Two volunteer learners (separate processes) average gradients with hivemind and end each step identical.

Each learner has its own shard of the data; after two steps both hold the parameters of two SGD steps on
the *averaged* gradient, computed here independently in-process as the reference. hivemind's all-reduce
alone leaves peers a few float32 ulps apart (`local + (average - local)`); the learners reconcile after
every step (the group's leader's bytes win), so the two parameter files must be byte-identical. A learner
that stepped on its own gradient differs from the reference by far more than the tolerance, so the test
fails if averaging does not happen.

Here the jobs that train end to end; the pure checks in tests/unit/; the ones with real processes and
servers in tests/integration/, under the same name.
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
