"""`build_loop`: the one place the training loop is put together.

Whoever trains (the learner pod and `dverl run`, the open DHT quick start, the Python facade, the
benchmarks) brings the trainer and the roles it reached (`wiring.connect_roles`, or volunteers found in a
DHT) and gets back a `Loop`: the coordinator with its dispatcher, prompts, sampler, metrics file and
checkpoints, built the same way every time. What differs between callers enters as data (a resume point,
an output folder) or as an attachment: a hook that joins the dispatcher before the first step (the
volunteer hub, the in-cluster scaling watcher) and says how to let go of it at the end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.status import StatusBoard
from decentralized_verl.data import PromptSampler
from decentralized_verl.orchestration.coordinator import Coordinator, LoopParts
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.orchestration.prompts import prepare_prompts
from decentralized_verl.orchestration.wiring import RoleClients
from decentralized_verl.reporting.metrics import EVAL_FILE, MetricsLog, truncate_after
from decentralized_verl.reporting.trackers import RunInfo
from decentralized_verl.spec import JobSpec, with_defaults
from decentralized_verl.training.checkpoints.learner import (
    CheckpointClock,
    CheckpointWriter,
    ResumePoint,
    ShardedCheckpointWriter,
)
from decentralized_verl.training.checkpoints.root import checkpoint_root

log = logging.getLogger(__name__)

Closer = Callable[[], Awaitable[None]]


@dataclass
class LoopContext:
    """What an attachment sees before the first step; it may add workers to `dispatcher` and wrap
    `roles.publish` (volunteers learn of new weights that way)."""

    spec: JobSpec
    job: str
    trainer: Any
    tokenizer: Any
    roles: RoleClients
    dispatcher: Dispatcher
    status: StatusBoard
    start_version: int
    resumed: bool = False
    """The loop continues a checkpoint: attachments take up the state they kept beside it."""


Attachment = Callable[[LoopContext], Awaitable[Closer | None]]


@dataclass
class Loop:
    """A ready coordinator and everything to release once it is done (`close`, always)."""

    coordinator: Coordinator
    parts: LoopParts
    closers: list[Closer] = field(default_factory=list)

    async def run(self) -> dict[str, Any]:
        """Train to the end; returns the coordinator's summary."""
        return await self.coordinator.run()

    async def close(self) -> None:
        await release(self.closers)


async def release(closers: Sequence[Closer]) -> None:
    """Run every closer, newest first; one that fails does not keep the others from running."""
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.exception("closing the training loop")


CRITIC_STATE = "critic-state.pt"


def colocated_critic(roles: RoleClients) -> Any | None:
    """The critic worker running in this process (its state belongs in the learner's checkpoints)."""
    worker = getattr(roles.critic, "worker", None)
    return worker if hasattr(worker, "load_state") else None


def restore_colocated_critic(roles: RoleClients, folder: Path) -> None:
    critic = colocated_critic(roles)
    path = folder / CRITIC_STATE
    if critic is not None and path.exists():
        critic.load_state(torch.load(path, map_location="cpu", weights_only=True))


async def build_loop(
    spec: JobSpec,
    trainer: Any,
    tokenizer: Any,
    roles: RoleClients,
    *,
    job: str,
    output: Path | None = None,
    prompts: Sequence[Prompt] | None = None,
    base_dir: Path | None = None,
    status: StatusBoard | None = None,
    resume: ResumePoint | None = None,
    scatter: Callable[[list[Any]], Any] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    attach: Sequence[Attachment] = (),
    checkpoint: bool = False,
    save: Callable[[Path, dict[str, Any]], None] | None = None,
    stop: asyncio.Event | None = None,
) -> Loop:
    """Put the loop together from a spec, a trainer and the roles it talks to.

    `output` holds metrics.jsonl and, with `checkpoint` (a learner that can be resumed), checkpoints at the
    spec's interval (automatic unless `training.checkpoint.every` says otherwise; 0 turns them off).
    `prompts` defaults to the spec's training file rendered for `tokenizer`. `scatter` sends data-parallel
    learner replicas their shards (None for one learner). `save` writes a sharded learner's checkpoint on
    every rank together (None: rank 0 snapshots the whole model and writes it in the background). `stop`,
    once set, makes the loop checkpoint its last finished step and raise `TrainingStopped`.
    """
    status = status or StatusBoard()
    closers: list[Closer] = [roles.close]
    try:
        if prompts is None:
            prompts = prepare_prompts(spec, tokenizer, spec.data.train, base_dir)
        eval_prompts = (
            prepare_prompts(spec, tokenizer, spec.data.eval, base_dir, limit=spec.data.eval_samples)
            if spec.data.eval
            else []
        )
        sampler = PromptSampler(
            len(prompts),
            spec.training.batch_size * spec.roles.learner.replicas,
            seed=spec.training.seed,
            drop_last=True,
        )
        start_step, start_version = _resume_at(resume, sampler, roles, status)
        if output is not None:
            _drop_rows_after(output, start_step)
        writer = clock = None
        if checkpoint and output is not None and spec.training.checkpoint.every != 0:
            writer, clock = _checkpointing(spec, trainer, tokenizer, roles, output, save, start_step)

            async def close_writer() -> None:
                await asyncio.to_thread(writer.close)

            closers.append(close_writer)
        dispatcher = Dispatcher(roles.rollout, roles.priors)
        context = LoopContext(
            spec,
            job,
            trainer,
            tokenizer,
            roles,
            dispatcher,
            status,
            start_version,
            resumed=resume is not None,
        )
        for attachment in attach:
            closer = await attachment(context)
            if closer is not None:
                closers.append(closer)
        metrics = None
        if output is not None:
            metrics = _metrics_log(spec, job, output)

            async def close_metrics() -> None:
                metrics.close()

            closers.append(close_metrics)
        parts = LoopParts(
            spec=spec,
            trainer=trainer,
            dispatcher=dispatcher,
            reward=roles.reward,
            reference=roles.reference,
            critic=roles.critic,
            prompts=prompts,
            eval_prompts=eval_prompts,
            sampler=sampler,
            pad_token_id=tokenizer.pad_token_id,
            publish=roles.publish,
            scatter=scatter,
            checkpoints=writer,
            checkpoint_clock=clock,
            status=status,
            metrics=metrics,
            on_step=on_step,
            async_capable=roles.remote_rollout,
            stop=stop,
            learner_name=f"{job}-learner-0",
        )
    except BaseException:
        await release(closers)
        raise
    coordinator = Coordinator(parts, start_step=start_step, start_version=start_version)
    return Loop(coordinator, parts, closers)


def _resume_at(
    resume: ResumePoint | None, sampler: Any, roles: RoleClients, status: StatusBoard
) -> tuple[int, int]:
    """The step and policy version the loop starts from. A resumed learner takes up the prompt order,
    step and colocated critic of its checkpoint; its version is the checkpoint's unless rollout workers
    still hold a newer number from before the restart (a version number never names other weights)."""
    if resume is None:
        return 0, roles.start_version
    sampler.load_state(resume.sampler_state)
    status.update(last_checkpoint=str(resume.folder))
    restore_colocated_critic(roles, resume.folder)
    return resume.step, max(resume.policy_version, roles.start_version)


def _drop_rows_after(output: Path, start_step: int) -> None:
    """The steps after the start are done again: an earlier run's rows for them go, said aloud, so the
    metrics and evaluation files hold each step once."""
    dropped = truncate_after(output / "metrics.jsonl", start_step)
    truncate_after(output / EVAL_FILE, start_step)
    if dropped:
        log.warning(
            "starting at step %d: removed %d later rows of an earlier run from %s",
            start_step, dropped, output / "metrics.jsonl",
        )  # fmt: skip


def _checkpointing(
    spec: JobSpec,
    trainer: Any,
    tokenizer: Any,
    roles: RoleClients,
    output: Path,
    save: Callable[[Path, dict[str, Any]], None] | None,
    start_step: int,
) -> tuple[Any, Any]:
    """The checkpoint writer and the clock that says when to use it. A sharded learner saves on every
    rank together (`save`); otherwise rank 0 snapshots the whole model, with a colocated critic's state
    beside it so a resume restores both."""
    keep = spec.training.checkpoint.keep
    root = checkpoint_root(spec, output)
    if save is not None:
        writer: Any = ShardedCheckpointWriter(root, save, keep)
    else:
        critic = colocated_critic(roles)
        extras = {CRITIC_STATE: critic.state} if critic is not None else None
        writer = CheckpointWriter(root, trainer, tokenizer, keep, extras)
    return writer, CheckpointClock(spec.training.checkpoint.every, last_step=start_step)


def _metrics_log(spec: JobSpec, job: str, output: Path) -> MetricsLog:
    """metrics.jsonl in `output`, mirrored to the trackers the spec names, which are told the run's name
    and its full spec (defaults included) so a run can be told apart from its neighbours there."""
    tracking = spec.training.tracking
    run = RunInfo(tracking.run_name or job, tracking.project, output, {"job": job, **with_defaults(spec)})
    return MetricsLog(output / "metrics.jsonl", list(spec.training.logging), run=run)
