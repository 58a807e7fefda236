"""Reward and reference volunteers (open quick-start mode) over real Hivemind P2P.

In-process: two real DHT peers, the volunteer's handlers on one and the trainer's clients on the other;
answers are compared with hand-worked rewards and with log-probs from a slow per-sequence forward pass.
As processes: seed 000's quick start with `--role reward` and `--role reference` workers and a GRPO
trainer with a KL term, which must take every reward and reference log-prob from the volunteers.

Here the jobs that train end to end; the pure checks in tests/unit/; the ones with real processes and
servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support.local_models import save_tiny_model
from tests.support.processes import ProcessGroup, console_env, free_port

pytestmark = pytest.mark.usefixtures("collected_before_fork")


def test_quick_start_takes_rewards_and_reference_logprobs_from_volunteers(tmp_path: Path) -> None:
    shell = ProcessGroup(tmp_path)
    try:
        model = save_tiny_model(tmp_path / "tiny-llama")
        (tmp_path / "prompts.json").write_text(json.dumps(["Say hi", "Count", "Name a colour", "Spell cat"]))
        shell.start("dht", f"dverl-dht --port {free_port()}")
        maddr = shell.wait_for("dht", r"--initial-peers (\S+)").group(1)
        ids = {}
        for role in ("actor", "reward", "reference"):
            shell.start(
                role,
                f"dverl-worker --initial-peers {maddr} --model {model} --role {role} --port {free_port()}",
            )
        for role in ("actor", "reward", "reference"):
            ids[role] = shell.wait_for(role, rf"worker (\S+) serves {role}").group(1)

        train = (
            f"dverl-train --initial-peers {maddr} --prompts-file prompts.json --algorithm grpo "
            "--num-epochs 1 "
            "--batch-size 2 --samples-per-prompt 2 --max-new-tokens 6 --kl-coef 0.05 --verify-fraction 0 "
            "--output run --wait-workers 60"
        )
        out = subprocess.run(
            shlex.split(train),
            capture_output=True,
            text=True,
            env=console_env(),
            cwd=tmp_path,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"rewards: reward volunteer {ids['reward']}" in out.stdout
        assert f"reference log-probs: reference volunteer {ids['reference']}" in out.stdout
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        steps = 2
        assert summary["steps"] == steps
        assert summary["reward_peer"] == ids["reward"] and summary["reference_peer"] == ids["reference"]
        # every step's rewards and reference log-probs came from the volunteers, none from the trainer
        assert summary["reward_calls"] == {"remote_calls": steps, "local_calls": 0, "failures": []}
        assert summary["reference_calls"] == {"remote_calls": steps, "local_calls": 0, "failures": []}
        records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert len(records) == steps and all(math.isfinite(r["kl"]) for r in records)
        # the first update compares the initial policy with itself: the volunteer's reference log-probs
        # must equal the learner's own, so the KL is zero (wrong or misaligned log-probs would not be)
        assert abs(records[0]["kl"]) < 1e-6

        for role in ("reward", "reference"):
            assert shell.stop(role) == 0
        samples = steps * 2 * 2  # prompts per step x samples per prompt
        assert f"served {steps} score requests ({samples} completions)" in shell.log("reward")
        assert re.search(rf"served {steps} log-prob requests \((\d+) sequences\)", shell.log("reference"))
    finally:
        shell.close()
