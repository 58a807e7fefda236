"""Two volunteer learners (separate processes) average gradients through hivemind.Optimizer.

Each learner has its own shard of the data; after one step both hold the parameters of one SGD step on
the *averaged* gradient, computed here independently in-process as the reference. Bitwise equality is
not what hivemind's all-reduce gives: it ships `average - local` deltas that each peer adds to its own
copy, so a few elements differ in the last bit (float32 ulp, ~1e-9 here); the step itself moves
parameters by ~1e-2, and a learner that stepped on its own gradient differs from the reference by far
more than the tolerance, so the test still fails if averaging does not happen.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
LR = 0.1
BATCH = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def save_tiny_model(folder: Path) -> Path:
    """A local HF folder `--model PATH` accepts: tiny LlamaForCausalLM + the offline char tokenizer."""
    from decentralized_verl.models.tiny import build_tiny, tiny_config
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.spec import TinyModelSpec

    tokenizer = build_char_tokenizer()
    tiny = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    build_tiny(tiny_config(tiny, tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def reference_step(model_dir: Path, data: Path) -> tuple[dict, dict]:
    """(SGD step on the mean of both shards' gradients, SGD step on shard 0's gradient alone)."""
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.volunteers.learner import batch_for_step, lm_loss, read_pairs, shard_of

    pairs = read_pairs(str(data))
    grads = []
    for shard in (0, 1):
        model, tokenizer = load_model_and_tokenizer(ModelSpec(path=str(model_dir)), padding_side="right")
        model.train()
        lm_loss(model, tokenizer, batch_for_step(shard_of(pairs, shard, 2), 0, BATCH)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    with torch.no_grad():
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        averaged = {n: initial[n] - LR * (grads[0][n] + grads[1][n]) / 2 for n in initial}
        alone = {n: initial[n] - LR * grads[0][n] for n in initial}
    return averaged, alone


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


@pytest.mark.skip(
    reason="quarantined: in a clean CI run one learner stepped in a hivemind group of 1 (race between the "
    "DHT barrier and hivemind.Optimizer's matchmaking); issue 7 stays open until the barrier waits for the "
    "averaging group itself"
)
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
            env=env(),
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
                f"--data {data} --shard {shard} --num-shards 2 --peers 2 --steps 1 --batch-size {BATCH} "
                f"--learning-rate {LR} --digest-out {tmp_path}/l{shard}.json"
            )
            procs.append(
                subprocess.Popen(cmd.split(), stdout=logs[f"l{shard}"], stderr=subprocess.STDOUT, env=env())
            )
        for proc, name in zip(procs[1:], ("l0", "l1"), strict=True):
            assert proc.wait(300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)

    results = [json.loads((tmp_path / f"l{i}.json").read_text()) for i in (0, 1)]
    assert [r["epoch"] for r in results] == [1, 1]
    assert [r["peers_per_step"] for r in results] == [
        [2],
        [2],
    ]  # both passed the barrier and stepped together
    assert results[0]["peer_id"] != results[1]["peer_id"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", r["sha256"]) for r in results)
    states = [load_file(str(tmp_path / f"l{i}.json.safetensors")) for i in (0, 1)]
    averaged, alone = reference_step(model, data)
    assert max_diff(states[0], states[1]) < 1e-7  # the same parameters, up to the last float32 bit
    assert max_diff(states[0], averaged) < 1e-6 and max_diff(states[1], averaged) < 1e-6
    assert max_diff(alone, averaged) > 1e-3  # stepping on one shard's gradient would be caught


def test_learner_shards_are_disjoint_and_cover_the_data() -> None:
    from decentralized_verl.errors import VolunteerError
    from decentralized_verl.volunteers.learner import batch_for_step, shard_of

    items = list(range(10))
    shards = [shard_of(items, i, 3) for i in range(3)]
    assert sorted(x for s in shards for x in s) == items
    assert batch_for_step([1, 2, 3], 1, 2) == [3, 1]
    with pytest.raises(VolunteerError, match="--shard"):
        shard_of(items, 3, 3)
    with pytest.raises(VolunteerError, match="empty"):
        shard_of([1], 1, 2)
