"""Connect the coordinator to every serving role: remote workers where the plan put them, else in-process.

One function for the learner process and the Python API facade, so a colocated role and a remote one are
reached through the same protocol and built in one place. Remote reward, reference and critic workers are
reached through a `ScoringPool` (every replica, with failover); rollout workers through the dispatcher.

Weights to remote rollout workers go through `transport.weights.fanout.WeightFanout`: each version is held by
the learner's publisher (served for pulls by the learner's Weights service) and, with two or more remote
rollout workers, pushed down a chain of them, so the learner sends one copy instead of N.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.core.interfaces import CriticClient, ReferenceClient, RewardClient, RolloutClient
from decentralized_verl.models.lora import is_lora
from decentralized_verl.orchestration.failover import ScoringPool
from decentralized_verl.planning.devices import GPU_PRIORS
from decentralized_verl.serving import local, scoring
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spec import JobSpec
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport import clients
from decentralized_verl.transport.weights.fanout import WeightFanout

log = logging.getLogger(__name__)


@dataclass
class RoleClients:
    rollout: list[RolloutClient]
    priors: dict[str, float]
    publish: Callable[[int], None]
    """Make policy version v available to the rollout side."""
    reward: RewardClient
    reference: ReferenceClient | None
    critic: CriticClient | None
    start_version: int = 0
    """The first policy version to publish: the checkpoint's, or past any version rollout workers still
    hold from before a learner restart (never reuse a version number for other weights)."""
    remote_rollout: bool = False
    """Rollout runs in processes of its own, so generation may overlap the update (async RL)."""
    weights: Any | None = None
    """The `WeightFanout` feeding remote rollout workers (None when rollout is colocated): add a rollout
    worker that joins at run time with `weights.add_receiver(address)`; close with `await weights.close()`."""

    async def close(self) -> None:
        """Release every client and the weight fan-out."""
        for client in [*self.rollout, self.reward, self.reference, self.critic]:
            close = getattr(client, "close", None)
            if close is not None:
                await close()
        if self.weights is not None:
            await self.weights.close()


async def past_held_versions(rollout: list[Any], start_version: int) -> int:
    """`start_version`, or one past the newest version a rollout worker still holds when that is newer: a
    learner restarted from a checkpoint must not publish other weights under a number already used."""
    held = []
    for client in rollout:
        try:
            held.append((await client.info()).policy_version)
        except Exception as exc:  # a worker that cannot say is one that will be sent the new version
            log.info("%s: held version unknown (%s)", client.worker_id, exc)
    newest = max(held, default=start_version)
    if newest > start_version:
        log.warning(
            "rollout workers hold policy version %d from before this learner restarted; publishing the "
            "checkpoint's weights as version %d",
            newest,
            newest + 1,
        )
        return newest + 1
    return start_version


def _nowhere(role: str) -> list[str]:
    """No remote workers of any role: everything runs in this process."""
    return []


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
    vllm_eager: bool = False,
    reward_override: RewardClient | None = None,
    ready_timeout: float = 900.0,
    weights_source: Callable[[], Any] | None = None,
) -> RoleClients:
    """Reach every serving role: the remote workers `addresses(role)` names, once ready, else a worker in
    this process. Rollout is remote only with a `publisher` to send it weights; `pools(role)` names the
    GPU pool of each remote worker, so the dispatcher can weigh them before it has measured them."""

    def current() -> Any:
        """The weights to send: `weights_source()` (a sharded learner's gathered stream), else the model's."""
        return weights_source() if weights_source is not None else rollout_state_dict(model)

    addresses = addresses or _nowhere
    pools = pools or _nowhere

    async def pool(role: str, client_type: Any, *, split: bool) -> ScoringPool | None:
        return await _remote_pool(job, role, addresses(role), client_type, split=split, timeout=ready_timeout)

    remote = addresses("rollout")
    if remote and publisher is not None:
        rollout = await _remote_rollout(
            spec, job, remote, pools("rollout"), publisher, current, start_version, ready_timeout
        )
    else:
        rollout = _colocated_rollout(spec, job, model, tokenizer, start_version, vllm_eager)
    reward = reward_override
    if reward is None:
        reward = await pool("reward", clients.GrpcRewardClient, split=True)
        reward = reward or local.LocalRewardClient(scoring.RewardWorker.from_spec(spec))
    reference = None
    if spec.roles.reference is not None:
        reference = await pool("reference", clients.GrpcReferenceClient, split=True)
        if reference is None:
            reference = _local_reference(spec, model, tokenizer, temperature)
    critic = None
    if spec.roles.critic is not None:
        critic = await pool("critic", clients.GrpcCriticClient, split=False)
        critic = critic or local.LocalCriticClient(scoring.CriticWorker.from_spec(spec))
    return RoleClients(
        rollout.clients,
        rollout.priors,
        rollout.publish,
        reward,
        reference,
        critic,
        start_version=rollout.start_version,
        remote_rollout=rollout.weights is not None,
        weights=rollout.weights,
    )


@dataclass
class _RolloutSide:
    """How the coordinator reaches rollout and tells it of each new policy version."""

    clients: list[RolloutClient]
    priors: dict[str, float]
    publish: Callable[[int], None]
    start_version: int
    weights: Any | None = None


async def _remote_pool(
    job: str, role: str, found: list[str], client_type: Any, *, split: bool, timeout: float
) -> ScoringPool | None:
    """The role's remote workers behind failover (all replicas, not only the first), once ready; None
    when the plan put none elsewhere."""
    for address in found:
        await clients.wait_ready(address, timeout=timeout)
    if not found:
        return None
    workers = [client_type(a, worker_id=f"{job}-{role}-{i}") for i, a in enumerate(found)]
    return ScoringPool(role, workers, split=split)


async def _remote_rollout(
    spec: JobSpec,
    job: str,
    remote: list[str],
    gpu_pools: list[str],
    publisher: Any,
    current: Callable[[], Any],
    start_version: int,
    ready_timeout: float,
) -> _RolloutSide:
    """Rollout workers in processes of their own, fed weights through a `WeightFanout`. They get the
    starting weights before the first step, under a version number none of them has used already."""
    for address in remote:
        await clients.wait_ready(address, timeout=ready_timeout)
    rollout: list[RolloutClient] = [
        clients.GrpcRolloutClient(
            address, worker_id=f"{job}-rollout-{i}", allow_newer=spec.training.max_staleness > 0
        )
        for i, address in enumerate(remote)
    ]
    priors = {f"{job}-rollout-{i}": GPU_PRIORS.get(pool, 1.0) for i, pool in enumerate(gpu_pools)}
    start_version = await past_held_versions(rollout, start_version)
    weights = WeightFanout(publisher, remote)
    await weights.publish(current(), start_version)
    loop = asyncio.get_running_loop()

    def publish(version: int) -> None:  # called from a worker thread (the coordinator's to_thread)
        weights.publish_blocking(current(), version, loop)

    return _RolloutSide(rollout, priors, publish, start_version, weights)


def _colocated_rollout(
    spec: JobSpec, job: str, model: Any, tokenizer: Any, start_version: int, vllm_eager: bool
) -> _RolloutSide:
    """Rollout in this process on the learner's own model: publishing a version only renames what the
    backend already shares, nothing is copied."""
    backend = make_backend(
        spec.roles.rollout.backend_kind,
        model,
        tokenizer,
        eager=vllm_eager,
        version=start_version,
        seed=spec.training.seed,
    )
    worker = RolloutWorker(backend, f"{job}-learner-0/rollout", environment=spec.data.environment)

    def publish(version: int) -> None:
        backend.mark_version(version)  # the colocated backend shares the learner's weights

    return _RolloutSide([local.LocalRolloutClient(worker)], {}, publish, start_version)


def _local_reference(spec: JobSpec, model: Any, tokenizer: Any, temperature: float) -> ReferenceClient:
    """A reference in this process: the policy as it starts, so the KL penalty measures drift from where
    training began however far the learner's own weights move. For a LoRA policy that is its own base
    with the adapters switched off (no second copy: a QLoRA job holds one 4-bit base); otherwise a frozen
    copy of the policy."""
    size = (spec.training.microbatch_size or 8) * spec.algorithm.samples_per_prompt
    if is_lora(model):
        worker = scoring.ReferenceWorker(
            model, temperature, pad_token_id=tokenizer.pad_token_id, microbatch_size=size, shares_policy=True
        )
        return local.LocalReferenceClient(worker)
    frozen = copy.deepcopy(model).eval()
    for param in frozen.parameters():
        param.requires_grad_(False)
    return local.LocalReferenceClient(
        scoring.ReferenceWorker(
            frozen, temperature, pad_token_id=tokenizer.pad_token_id, microbatch_size=size
        )
    )
