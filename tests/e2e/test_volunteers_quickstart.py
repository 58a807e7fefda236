"""Seed 000's quick start, command for command, as separate processes on this machine:

    dverl-dht --port P                                                        # prints --initial-peers
    dverl-worker --initial-peers MADDR --model PATH --role actor --port P1
    dverl-worker --initial-peers MADDR --model PATH --role critic --port P2
    dverl-train --initial-peers MADDR --prompts-file prompts.json --algorithm ppo --num-epochs N

with a local model folder (a tiny Llama and the offline character tokenizer, saved with save_pretrained)
instead of a hub name. The trainer finds the workers through the DHT alone.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.local_models import save_tiny_model
from tests.support.processes import ProcessGroup, console_env, free_port

EPOCHS = 3
PROMPTS = ["Write a poem about AI", "Explain quantum computing", "Say hi", "Count to three"]


class Shell(ProcessGroup):
    """Commands started as a user would in separate terminals; output kept per command."""


@pytest.fixture
def shell(tmp_path: Path):
    s = Shell(tmp_path)
    yield s
    s.close()


def run(line: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        line.split(), capture_output=True, text=True, env=console_env(), cwd=cwd, timeout=timeout
    )


def test_seed_000_quick_start_command_for_command(shell: Shell, tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "tiny-llama")
    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    port, actor_port, critic_port = free_port(), free_port(), free_port()

    shell.start("dht", f"dverl-dht --port {port}")
    maddr = shell.wait_for("dht", r"--initial-peers (\S+)").group(1)
    assert re.fullmatch(rf"/ip4/[\d.]+/tcp/{port}/p2p/12D3Koo\w+", maddr), maddr
    assert "Peer ID: 12D3Koo" in shell.log("dht")

    shell.start(
        "actor", f"dverl-worker --initial-peers {maddr} --model {model} --role actor --port {actor_port}"
    )
    shell.start(
        "critic", f"dverl-worker --initial-peers {maddr} --model {model} --role critic --port {critic_port}"
    )
    actor_id = shell.wait_for("actor", r"worker (\S+) serves actor").group(1)
    critic_id = shell.wait_for("critic", r"worker (\S+) serves critic").group(1)

    out = run(
        f"dverl-train --initial-peers {maddr} --prompts-file prompts.json --algorithm ppo "
        f"--num-epochs {EPOCHS} --batch-size 2 --verify-fraction 0.5 --output run",
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = EPOCHS * len(PROMPTS) // 2
    assert f"with 1 actor(s) and critic {critic_id}" in out.stdout
    assert re.findall(r"^step (\d+)/(\d+): reward_mean=", out.stdout, re.M) == [
        (str(i), str(steps)) for i in range(1, steps + 1)
    ]
    assert re.search(rf"training finished: {steps} steps \({EPOCHS} epochs\)", out.stdout), out.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == steps and summary["policy_version"] == steps
    # every prompt answered once per epoch, all by the one actor; half of each batch re-checked, none failed
    assert summary["actor_samples"] == {actor_id: {"accepted": EPOCHS * len(PROMPTS), "rejected": 0}}
    assert summary["verified_samples"] == steps and summary["blocked"] == {}
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == steps
    assert all(r["unique_samples"] == r["expected_samples"] == 2 for r in records)
    assert all(isinstance(r["critic_loss"], float) for r in records)

    # the workers served the work: the actor generated every sample and pulled each new policy version
    # over P2P; the critic answered one values request and one update per step
    assert shell.stop("actor") == 0 and shell.stop("critic") == 0
    served = re.search(
        r"served (\d+) samples in (\d+) requests, received (\d+) weight bytes", shell.log("actor")
    )
    assert served and int(served.group(1)) == EPOCHS * len(PROMPTS) and int(served.group(2)) == steps
    assert int(served.group(3)) > 0
    assert f"served {steps} values requests and {steps} train steps" in shell.log("critic")

    # bad inputs: a clear message and exit 2, no traceback
    bad = run(f"dverl-worker --initial-peers {maddr} --role actor", tmp_path, timeout=60)
    assert bad.returncode == 2 and "--model PATH" in bad.stderr
    bad = run(f"dverl-worker --initial-peers {maddr} --model {tmp_path}/nope --role actor", tmp_path)
    assert bad.returncode == 2 and "is not a local model folder" in bad.stderr, bad.stderr[-2000:]
    bad = run(f"dverl-train --initial-peers {maddr} --algorithm ppo", tmp_path, timeout=60)
    assert bad.returncode == 2 and "--prompts-file" in bad.stderr
    bad = run(
        f"dverl-train --initial-peers {maddr} --prompts-file prompts.json --job nobody --wait-workers 2",
        tmp_path,
    )
    assert bad.returncode == 2 and "no actor announced under dverl/nobody/volunteers" in bad.stderr, (
        bad.stderr
    )


def test_train_without_stage_or_peers_is_a_usage_error(tmp_path: Path) -> None:
    out = run("dverl-train --algorithm ppo", tmp_path, timeout=60)
    assert out.returncode == 2 and "--stage and --config" in out.stderr
