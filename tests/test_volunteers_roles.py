"""Reward and reference volunteers (open quick-start mode) over real Hivemind P2P.

In-process: two real DHT peers, the volunteer's handlers on one and the trainer's clients on the other;
answers are compared with hand-worked rewards and with log-probs from a slow per-sequence forward pass.
As processes: seed 000's quick start with `--role reward` and `--role reference` workers and a GRPO
trainer with a KL term, which must take every reward and reference log-prob from the volunteers.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.local_models import save_tiny_model
from tests.support.processes import ProcessGroup, console_env, free_port

pytestmark = pytest.mark.usefixtures("collected_before_fork")


def sample(prompt_ids, response_ids, *, prompt_text="", text="", ground_truth=""):
    from decentralized_verl.core.samples import Prompt, Sample

    return Sample(
        prompt=Prompt("p", 0, tuple(prompt_ids), prompt_text, ground_truth=ground_truth),
        sample_index=0,
        response_ids=tuple(response_ids),
        logprobs=(),
        finish_reason="stop",
        text=text,
        policy_version=0,
    )


def slow_logprobs(model, prompt_ids, response_ids, temperature: float) -> list[float]:
    """One unpadded forward per sequence: log softmax(logits / T) at each response token."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    return [float(logp[start + k - 1, tok]) for k, tok in enumerate(response_ids)]


async def test_reward_and_reference_volunteers_answer_like_the_trainer_would(
    two_peers, tmp_path: Path
) -> None:
    from decentralized_verl.core.interfaces import WorkerFailure
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.serving.p2p_endpoints import ReferenceEndpoint, RewardEndpoint
    from decentralized_verl.serving.scoring import ReferenceWorker, RewardWorker
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.transport import messages as m
    from decentralized_verl.transport.clients import P2PReferenceClient, P2PRewardClient
    from decentralized_verl.volunteers.fallback import FallbackReward
    from decentralized_verl.volunteers.rewards import QUICKSTART_REWARD

    torch.set_num_threads(1)
    server, caller = two_peers
    serve_p2p, call_p2p = await server.replicate_p2p(), await caller.replicate_p2p()
    server_id = server.peer_id.to_base58()
    folder = save_tiny_model(tmp_path / "tiny")
    model, tokenizer = load_model_and_tokenizer(ModelSpec(path=str(folder)))
    reward_endpoint = RewardEndpoint(serve_p2p, RewardWorker(None), has_reward_model=False)
    await reward_endpoint.register()
    reference_endpoint = ReferenceEndpoint(
        serve_p2p,
        ReferenceWorker(model, 0.7, pad_token_id=tokenizer.pad_token_id, microbatch_size=2),
        limits=m.WireLimits(vocab_size=model.config.vocab_size),
    )
    await reference_endpoint.register()

    # rewards: the quick-start reward by hand (share of letters and spaces) and a built-in one
    rewards = P2PRewardClient(call_p2p, server_id)
    texts = ["ab c", "a1", "!!!!"]
    got = await rewards.score([sample([1], [2], text=t) for t in texts], QUICKSTART_REWARD)
    assert [s for s, _ in got] == [1.0, 0.5, 0.0]
    boxed = await rewards.score(
        [
            sample([1], [2], text=r"so \boxed{4}", ground_truth="4"),
            sample([1], [2], text=r"\boxed{5}", ground_truth="4"),
        ],
        "boxed",
    )
    assert [s for s, _ in boxed] == [1.0, 0.0]
    assert reward_endpoint.requests == 2 and reward_endpoint.items == 5
    with pytest.raises(WorkerFailure, match="not shipped"):  # a volunteer runs no caller-named code
        await rewards.score([sample([1], [2], text="x")], "os:system")
    with pytest.raises(WorkerFailure, match="no reward model"):
        await rewards.score([sample([1], [2], text="x")], "reward_model")

    # reference log-probs: same numbers as an independent unpadded forward pass, ragged lengths
    reference = P2PReferenceClient(call_p2p, server_id)
    seqs = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14]), ([15, 16], [17])]
    got = await reference.logprobs([sample(p, r) for p, r in seqs])
    assert [len(x) for x in got] == [2, 4, 1]
    for (p, r), values in zip(seqs, got, strict=True):
        expected = slow_logprobs(model, p, r, 0.7)
        assert max(abs(a - b) for a, b in zip(values, expected, strict=True)) < 1e-5
        assert all(v <= 0 for v in values)
    assert reference_endpoint.requests == 1 and reference_endpoint.sequences == 3
    with pytest.raises(WorkerFailure, match="LogProbs"):  # a token outside the vocabulary is refused
        await reference.logprobs([sample([1], [model.config.vocab_size + 5])])

    # fallback: a peer that serves nothing -> the trainer's own reward, counted, then the peer is dropped
    gone = P2PRewardClient(call_p2p, caller.peer_id.to_base58(), deadline_s=10)
    fallback = FallbackReward(gone, lambda: _local_reward(), max_failures=2)
    for _ in range(3):
        assert [s for s, _ in await fallback.score([sample([1], [2], text="ab")], QUICKSTART_REWARD)] == [1.0]
    report = fallback.report()
    assert report["remote_calls"] == 0 and report["local_calls"] == 3 and len(report["failures"]) == 2
    assert fallback.remote is None
    await serve_p2p.shutdown()
    await call_p2p.shutdown()


def _local_reward():
    from decentralized_verl.serving.local import LocalRewardClient
    from decentralized_verl.serving.scoring import RewardWorker

    return LocalRewardClient(RewardWorker(None))


def test_trainer_picks_only_scoring_peers_it_can_trust_to_match(tmp_path: Path) -> None:
    from decentralized_verl.rewards.servable import servable_reward
    from decentralized_verl.volunteers.announce import VolunteerRecord
    from decentralized_verl.volunteers.open_peers import pick_reference_peer, pick_reward_peer

    mine, other = tmp_path / "policy", tmp_path / "other"
    mine.mkdir()
    other.mkdir()

    def rec(peer, role, model, started, temperature=1.0):
        return VolunteerRecord(peer, role, "cpu", 0.0, 0, 1e12, started, str(model), (), temperature)

    records = [
        rec("A", "reference", other, 1.0),
        rec("B", "reference", mine, 3.0, temperature=0.5),
        rec("C", "reference", mine, 2.0),
        rec("D", "actor", mine, 0.0),
    ]
    assert pick_reference_peer(records, str(mine), 1.0)[0].peer_id == "C"
    assert pick_reference_peer(records, str(mine), 0.5)[0].peer_id == "B"
    none, why = pick_reference_peer(records, str(mine), 0.8)
    assert none is None and "temperature" in why
    none, why = pick_reference_peer(records[:1], str(mine), 1.0)
    assert none is None and "other models" in why
    assert pick_reference_peer([], str(mine), 1.0) == (None, "no reference volunteer announced")

    class Spec:  # the two fields pick_reward_peer reads
        class data:
            reward_type = "boxed"
            reward_model = None

    rewards = [rec("R2", "reward", other, 5.0), rec("R1", "reward", mine, 4.0)]
    assert pick_reward_peer(rewards, Spec)[0].peer_id == "R1"
    Spec.data.reward_type = "reward_model"
    Spec.data.reward_model = type("M", (), {"path": str(other)})
    assert pick_reward_peer(rewards, Spec)[0].peer_id == "R2"
    Spec.data.reward_model = type("M", (), {"path": str(tmp_path / "rm")})
    assert pick_reward_peer(rewards, Spec)[0] is None

    assert servable_reward("boxed", has_reward_model=False) is None
    assert servable_reward("decentralized_verl.volunteers.rewards:letters", has_reward_model=False) is None
    assert servable_reward("decentralized_verl.rewardsX:f", has_reward_model=False) is not None
    assert servable_reward("subprocess:run", has_reward_model=False) is not None
    assert servable_reward("reward_model", has_reward_model=True) is None


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


def test_token_checked_volunteers_never_serve_rewards(tmp_path: Path) -> None:
    """The RLHFJob flow refuses reward volunteers before touching the network."""

    from decentralized_verl.entrypoints.volunteer import VolunteerOptions, run_volunteer
    from decentralized_verl.errors import VolunteerError
    from decentralized_verl.volunteers.tokens import issue_token

    token = issue_token(b"s" * 32, "job", 60.0)
    for role in ("reward", "reference"):
        options = VolunteerOptions(
            initial_peers=("/ip4/127.0.0.1/tcp/1/p2p/x",), job="job", token=token, role=role
        )
        with pytest.raises(VolunteerError, match="never takes"):
            asyncio.run(run_volunteer(options))
