"""The reward role over Hivemind P2P: a volunteer scores (prompt, completion) pairs for a quick-start trainer.

Same messages as the in-cluster Reward gRPC service (`ScoreRequest` -> `ScoreResponse`), validated by
the same `transport.messages` converters on both ends; each item names the reward (the trainer sends
its job's `rewardType`), so one reward volunteer serves any job on its DHT.

Trust: reward volunteers exist for the open quick-start / trusted-network mode only. A reward is the
training signal itself, and a wrong one cannot be detected from its shape, so the token-checked
RLHFJob flow (worker.py, discovery.py) never takes rewards from a volunteer: its coordinator scores on
the trusted side. A reward volunteer runs only rewards shipped with this package (the built-in types and
`module:function` callables under SHIPPED_REWARD_MODULES), never an arbitrary module a caller names,
and `reward_model` only when its `--model` folder is a reward model (a sequence classifier).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.roles.interfaces import WorkerFailure
from decentralized_verl.roles.samples import Sample
from decentralized_verl.transport import messages as m
from decentralized_verl.volunteers import p2p as wire

SCORE = "dverl.Reward/Score"
SHIPPED_REWARD_MODULES = ("decentralized_verl.rewards", "decentralized_verl.volunteers.rewards")


def servable_reward(kind: str, *, has_reward_model: bool) -> str | None:
    """None when this volunteer may run reward `kind`; otherwise why not."""
    from decentralized_verl.rewards.names import BUILTIN_REWARD_TYPES

    if kind == "reward_model":
        return None if has_reward_model else "this reward volunteer holds no reward model"
    if kind in BUILTIN_REWARD_TYPES:
        return None
    module, sep, function = kind.partition(":")
    if sep and function and any(module == p or module.startswith(p + ".") for p in SHIPPED_REWARD_MODULES):
        return None
    return f"reward {kind!r} is not shipped with decentralized-verl (a volunteer runs no caller-named code)"


def is_reward_model_folder(folder: str) -> bool:
    """True when `folder`'s config.json names a sequence-classification architecture."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or ())


class RewardEndpoint:
    """The Score handler around a `roles.scoring.RewardWorker`; serves any caller (open mode)."""

    def __init__(self, p2p, worker, *, has_reward_model: bool, limits: m.WireLimits | None = None) -> None:
        self.p2p = p2p
        self.worker = worker
        self.has_reward_model = has_reward_model
        self.limits = limits or m.WireLimits()
        self.requests = 0
        self.items = 0

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(SCORE, self._score, pb.ScoreRequest)

    async def _score(self, request: pb.ScoreRequest, context) -> pb.ScoreResponse:
        items = m.score_request_from_proto(request, self.limits)
        for kind in sorted({it.reward_type for it in items}):
            refused = servable_reward(kind, has_reward_model=self.has_reward_model)
            if refused:
                raise PermissionError(refused)
        scores = await asyncio.to_thread(self.worker.score_items, items)
        self.requests += 1
        self.items += len(items)
        return m.scores_to_proto(scores)


class P2PRewardClient:
    """`RewardClient` for a reward peer; any transport or contract failure raises WorkerFailure."""

    def __init__(self, p2p, peer_id: str, *, deadline_s: float = 300.0) -> None:
        self.p2p = p2p
        self.peer_id = peer_id
        self.worker_id = f"reward-{peer_id[-8:]}"
        self.deadline_s = deadline_s

    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        items = [m.ScoreItem(s.prompt.text, s.text, s.prompt.ground_truth, reward_type) for s in samples]
        try:
            reply = await asyncio.wait_for(
                self.p2p.call_protobuf_handler(
                    wire.peer(self.peer_id), SCORE, m.score_request_to_proto(items), pb.ScoreResponse
                ),
                self.deadline_s,
            )
            return [(s.score, s.reason) for s in m.scores_from_proto(reply, len(items))]
        except TimeoutError:
            raise WorkerFailure(self.worker_id, f"Score: no answer within {self.deadline_s:g}s") from None
        except WireError as exc:
            raise WorkerFailure(self.worker_id, f"Score: {exc}") from None
        except Exception as exc:  # the peer vanished or refused (hivemind's P2PHandlerError)
            raise WorkerFailure(self.worker_id, f"Score: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        return None
