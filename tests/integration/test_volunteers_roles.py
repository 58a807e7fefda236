"""Reward and reference volunteers (open quick-start mode) over real Hivemind P2P.

In-process: two real DHT peers, the volunteer's handlers on one and the trainer's clients on the other;
answers are compared with hand-worked rewards and with log-probs from a slow per-sequence forward pass.
As processes: seed 000's quick start with `--role reward` and `--role reference` workers and a GRPO
trainer with a KL term, which must take every reward and reference log-prob from the volunteers.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.local_models import save_tiny_model

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
