"""Connect the coordinator to every serving role: remote workers where the plan put them, else in-process.

One function for the learner process and the Python API facade, so a colocated role and a remote one are
reached through the same protocol and built in one place.

Weights to remote rollout workers go through `transport.fanout_runtime.WeightFanout`: each version is held by
the learner's publisher (served for pulls by the learner's Weights service) and, with two or more remote
rollout workers, pushed down a chain of them, so the learner sends one copy instead of N.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decentralized_verl.core.interfaces import CriticClient, ReferenceClient, RewardClient, RolloutClient
from decentralized_verl.orchestration.dispatch import GPU_PRIORS
from decentralized_verl.spec import JobSpec


@dataclass
class RoleClients:
    rollout: list[RolloutClient]
    priors: dict[str, float]
    publish: Callable[[int], None]
    """Make policy version v available to the rollout side."""
    reward: RewardClient
    reference: ReferenceClient | None
    critic: CriticClient | None
    remote_rollout: bool = False
    """Rollout runs in processes of its own, so generation may overlap the update (async RL)."""
    weights: Any | None = None
    """The `WeightFanout` feeding remote rollout workers (None when rollout is colocated): add a rollout
    worker that joins at run time with `weights.add_receiver(address)`; close with `await weights.close()`."""

    async def close(self) -> None:
        """Release the rollout clients and the weight fan-out (scoring clients hold nothing to release)."""
        for client in self.rollout:
            await client.close()
        if self.weights is not None:
            await self.weights.close()


async def connect_roles(
    spec: JobSpec,
    job: str,
    model: Any,
    tokenizer: Any,
    *,
    temperature: float,
    publisher: Any | None,
    start_version: int = 0,
    addresses: Callable[[str], list[str]] | None = None,
    pools: Callable[[str], list[str]] | None = None,
    reward_override: RewardClient | None = None,
    ready_timeout: float = 900.0,
) -> RoleClients:
    from decentralized_verl.backends.base import make_backend
    from decentralized_verl.serving import local, scoring
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport import clients
    from decentralized_verl.transport.fanout_runtime import WeightFanout

    if addresses is None or pools is None:
        from decentralized_verl.settings import WorkerSettings

        settings = WorkerSettings.from_env()
        addresses = addresses or settings.addresses
        pools = pools or settings.pools

    async def first_ready(role: str) -> str | None:
        found = addresses(role)
        for address in found:
            await clients.wait_ready(address, timeout=ready_timeout)
        return found[0] if found else None

    remote = addresses("rollout")
    if remote and publisher is not None:
        for address in remote:
            await clients.wait_ready(address, timeout=ready_timeout)
        rollout: list[RolloutClient] = [
            clients.GrpcRolloutClient(
                address, worker_id=f"{job}-rollout-{i}", allow_newer=spec.training.max_staleness > 0
            )
            for i, address in enumerate(remote)
        ]
        priors = {f"{job}-rollout-{i}": GPU_PRIORS.get(pool, 1.0) for i, pool in enumerate(pools("rollout"))}
        weights = WeightFanout(publisher, remote)
        await weights.publish(rollout_state_dict(model), start_version)
        loop = asyncio.get_running_loop()

        def publish(version: int) -> None:  # called from a worker thread (the coordinator's to_thread)
            weights.publish_blocking(rollout_state_dict(model), version, loop)

    else:
        backend = make_backend(
            spec.roles.rollout.backend, model, tokenizer, version=start_version, seed=spec.training.seed
        )
        rollout = [local.LocalRolloutClient(RolloutWorker(backend, f"{job}-learner-0/rollout"))]
        priors = {}
        weights = None

        def publish(version: int) -> None:
            backend.mark_version(version)  # the colocated backend shares the learner's weights

    reward = reward_override
    if reward is None:
        address = await first_ready("reward")
        reward = (
            clients.GrpcRewardClient(address)
            if address
            else local.LocalRewardClient(scoring.RewardWorker.from_spec(spec))
        )
    reference = None
    if spec.roles.reference is not None:
        address = await first_ready("reference")
        if address:
            reference = clients.GrpcReferenceClient(address)
        else:
            frozen = copy.deepcopy(model).eval()
            for param in frozen.parameters():
                param.requires_grad_(False)
            size = (spec.training.microbatch_size or 8) * spec.algorithm.samples_per_prompt
            reference = local.LocalReferenceClient(
                scoring.ReferenceWorker(
                    frozen, temperature, pad_token_id=tokenizer.pad_token_id, microbatch_size=size
                )
            )
    critic = None
    if spec.roles.critic is not None:
        address = await first_ready("critic")
        critic = (
            clients.GrpcCriticClient(address)
            if address
            else local.LocalCriticClient(scoring.CriticWorker.from_spec(spec))
        )
    remote_rollout = bool(remote) and publisher is not None
    return RoleClients(rollout, priors, publish, reward, reference, critic, remote_rollout, weights)
