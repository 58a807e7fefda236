"""The quick-start trainer's reward and reference clients: an open peer when one can be trusted to match
(`volunteers.open_peers`), else the same role computed in the trainer itself, and a peer that fails falls
back to it too (`volunteers.fallback`).
"""

from __future__ import annotations

from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.serving import local, scoring
from decentralized_verl.transport.clients import P2PReferenceClient, P2PRewardClient
from decentralized_verl.transport.p2p import connect
from decentralized_verl.volunteers.announce import read_records
from decentralized_verl.volunteers.fallback import FallbackReference, FallbackReward
from decentralized_verl.volunteers.open_peers import pick_reference_peer, pick_reward_peer


async def scoring_roles(p2p, dht, spec, *, job: str, model_path: str, temperature: float, pad_token_id):
    """(reward client, reference client or None, description lines): volunteers when usable, else local."""
    records, _ = await read_records(dht, job)
    lines = []
    chosen, why = pick_reward_peer(records, spec)
    remote = None
    if chosen is not None:
        await connect(p2p, chosen.peer_id, chosen.maddrs)
        remote = P2PRewardClient(p2p, chosen.peer_id)
    lines.append(f"rewards: {why}" + ("" if chosen else "; computed by the trainer"))
    reward = FallbackReward(remote, lambda: local.LocalRewardClient(scoring.RewardWorker.from_spec(spec)))
    reference = None
    if spec.roles.reference is not None:
        chosen, why = pick_reference_peer(records, model_path, temperature)
        remote = None
        if chosen is not None:
            await connect(p2p, chosen.peer_id, chosen.maddrs)
            remote = P2PReferenceClient(p2p, chosen.peer_id)
        lines.append(f"reference log-probs: {why}" + ("" if chosen else "; computed by the trainer"))

        def make_local():
            # The initial policy from disk (the trainer's own model has moved on by the time this runs).
            model, _ = load_model_and_tokenizer(spec.model)
            return local.LocalReferenceClient(
                scoring.ReferenceWorker(model, temperature, pad_token_id=pad_token_id)
            )

        reference = FallbackReference(remote, make_local)
    return reward, reference, lines
