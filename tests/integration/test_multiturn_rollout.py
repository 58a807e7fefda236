"""Multi-turn episodes on the rollout side with a real tiny model: one sample per episode whose log-probs the
learner recomputes exactly on the model's tokens, whose loss mask covers exactly those tokens, which a
re-dispatch reproduces, which the trusted side scores by replaying the environment, and which a whole
training loop (colocated rollout, learner, reward) runs on.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spec.catalogue.backends import HF
from tests.support.multiturn import (
    GAME,
    SAMPLING,
    TINY,  # noqa: F401 (the `policy` fixture builds the module's TINY)
    play,
    prompts,
)

torch.set_num_threads(1)


async def _over_grpc(model, tok, items, environment):
    from decentralized_verl.serving.servicers import HealthServicer, RolloutServicer, serve
    from decentralized_verl.transport.clients import GrpcRolloutClient

    worker = RolloutWorker(make_backend(HF, model, tok, max_batch_size=8), "r0", environment=environment)
    server = await serve(0, RolloutServicer(worker), HealthServicer("rollout", "r0", ready=True))
    client = GrpcRolloutClient(f"127.0.0.1:{server.port}", "r0")
    try:
        return [s async for s in client.generate(items, SAMPLING, 0)]
    finally:
        await client.close()
        await server.stop(0)


class Reveal:
    """Shows the model the record it was given (a test of what reaches the worker)."""

    instructions = ""

    def reset(self, record):
        self.record = record

    def step(self, turn):
        from decentralized_verl.environments import StepResult

        return StepResult(f"reference={self.record.ground_truth} prompt={self.record.prompt_text[-40:]}")


@pytest.fixture
def reveal(monkeypatch: pytest.MonkeyPatch):
    import sys
    import types

    from decentralized_verl.environments.registry import environment_class

    module = types.ModuleType("tests_reveal")
    module.Reveal = Reveal
    monkeypatch.setitem(sys.modules, "tests_reveal", module)
    yield
    environment_class.cache_clear()


def test_episodes_cross_the_wire_with_their_record_and_mask(policy, reveal) -> None:
    import dataclasses

    from decentralized_verl.core.interfaces import WorkerFailure

    model, tok = policy
    ps = [dataclasses.replace(p, environment=True) for p in prompts(tok)]
    items = [(p, k) for p in ps for k in range(2)]
    local = play(model, tok, items)
    remote = asyncio.run(_over_grpc(model, tok, items, GAME))
    assert sorted(s.key for s in remote) == sorted(local)
    for s in remote:
        want = local[s.key]
        assert s.prompt in ps and s.prompt.ground_truth == "5"  # the coordinator's own prompt comes back
        assert s.response_ids == want.response_ids and s.loss_mask == want.loss_mask
        assert s.turns == want.turns and s.end_reason == want.end_reason
        assert s.extra["episode_reward"] == want.extra["episode_reward"]
        assert s.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    # The worker's environment played on the record that travelled with the item.
    shown = asyncio.run(
        _over_grpc(model, tok, items[:1], EpisodeSettings("tests_reveal:Reveal", max_turns=2))
    )
    env_text = tok.decode(
        [t for t, m in zip(shown[0].response_ids, shown[0].loss_mask, strict=True) if not m]
    )
    assert "reference=5 prompt=" in env_text and "Guess my number (0)" in env_text
    # A worker without the environment answers single completions: a breach of the request, refused.
    with pytest.raises(WorkerFailure, match="asked for a multi-turn episode"):
        asyncio.run(_over_grpc(model, tok, items, None))
