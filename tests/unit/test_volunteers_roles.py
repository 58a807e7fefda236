"""Reward and reference volunteers (open quick-start mode) over real Hivemind P2P.

In-process: two real DHT peers, the volunteer's handlers on one and the trainer's clients on the other;
answers are compared with hand-worked rewards and with log-probs from a slow per-sequence forward pass.
As processes: seed 000's quick start with `--role reward` and `--role reference` workers and a GRPO
trainer with a KL term, which must take every reward and reference log-prob from the volunteers.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


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
