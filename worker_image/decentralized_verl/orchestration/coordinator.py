"""The training loop of learner rank 0 (docs/internals.md, "How one training step flows").

prompts -> rollout (dispatched by throughput) -> rewards -> reference / critic -> filters and advantages
-> data-parallel update -> new weights out -> metrics, status, checkpoint, eval. The roles are reached
through the protocols in `core.interfaces`, whether they are remote workers or colocated in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from decentralized_verl.core.interfaces import CriticClient, ReferenceClient, RewardClient
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.status import StatusBoard
from decentralized_verl.environments.replay import ENVIRONMENT_REWARD
from decentralized_verl.errors import BAD_INPUT_REASON, DverlError, OperationFailed
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.orchestration.evaluation import Evaluator
from decentralized_verl.orchestration.refit_check import check_refit, fresh_rows, measured_parity
from decentralized_verl.orchestration.reward_errors import RewardErrorWatch
from decentralized_verl.orchestration.step_report import StepReporter, run_summary, step_record
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.runtime import compute_thread
from decentralized_verl.spec import JobSpec
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages, select_samples
from decentralized_verl.training.checkpoints.learner import CheckpointClock, CheckpointWriter

log = logging.getLogger(__name__)


@dataclass
class LoopParts:
    """Everything the loop talks to; put together only by `assemble.build_loop`."""

    spec: JobSpec
    trainer: Any  # PolicyTrainer
    dispatcher: Dispatcher
    reward: RewardClient
    reference: ReferenceClient | None
    critic: CriticClient | None
    prompts: Sequence[Prompt]
    eval_prompts: Sequence[Prompt]
    sampler: Any  # PromptSampler over `prompts`, sharded for world size 1 (rank 0 draws for everyone)
    pad_token_id: int
    publish: Callable[[int], None]
    """Make policy version v available to rollout workers (weights out)."""
    scatter: Callable[[list[Any]], Any] | None = None
    """Data-parallel: send each learner rank its shard, return rank 0's (None for one learner)."""
    checkpoints: CheckpointWriter | None = None
    """Takes a snapshot when `checkpoint_clock` says one is due (None: no checkpoints)."""
    checkpoint_clock: CheckpointClock | None = None
    status: StatusBoard = field(default_factory=StatusBoard)
    metrics: MetricsLog | None = None
    on_step: Callable[[dict[str, Any]], None] | None = None
    async_capable: bool = False
    """True when rollout runs outside the learner, so generation may overlap the update (maxStaleness)."""
    stop: asyncio.Event | None = None
    """Set on SIGTERM (eviction, preemption, `kubectl delete pod`): the loop checkpoints and leaves."""
    learner_name: str = "learner-0"
    """Learner rank 0's worker name, for errors that name it (refit parity)."""


class TrainingStopped(Exception):
    """The loop was asked to stop; `checkpoint` is where it left its state (None: nothing new to keep)."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"stopped after step {step}; state in {checkpoint or '(no new checkpoint)'}")


def failure_of(exc: BaseException) -> dict[str, str]:
    """What the Status reply says of the exception that ended training, so the operator's Failed condition
    names the cause whichever it hears first, this reply or the learner's exit: the words, and BadInput
    for input a person must fix (what `dverl` exits 2 for). A stop or a cancellation says nothing more."""
    if not isinstance(exc, Exception) or isinstance(exc, TrainingStopped):
        return {}
    if isinstance(exc, DverlError) and not isinstance(exc, OperationFailed):
        return {"failure": str(exc), "failure_reason": BAD_INPUT_REASON}
    return {"failure": f"{type(exc).__name__}: {exc}"}


@dataclass
class Generated:
    """One batch's rollout and rewards, possibly produced ahead of the step that learns on it."""

    items: list[tuple[Prompt, int]]
    samples: list[Sample]
    report: Any
    version: int
    timings: dict[str, float]
    started: float


class _Ahead:
    """The batches generating ahead of the step that learns on them, oldest first, each with the sampler's
    state from before its prompts were drawn: on a stop, the prompts of batches not learned from go back."""

    def __init__(self) -> None:
        self._tasks: deque[asyncio.Task[Generated]] = deque()
        self._drawn: deque[dict[str, Any]] = deque()

    def __len__(self) -> int:
        return len(self._tasks)

    def launch(self, sampler_before: dict[str, Any], task: asyncio.Task[Generated]) -> None:
        self._drawn.append(sampler_before)
        self._tasks.append(task)

    def first(self) -> asyncio.Task[Generated]:
        return self._tasks[0]

    def pop(self) -> None:
        """The oldest batch is generated and about to be learned from: its prompts are spent."""
        self._tasks.popleft()
        self._drawn.popleft()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    def sampler_before(self) -> dict[str, Any] | None:
        """The sampler's state before the oldest batch not learned from (None: every drawn batch was)."""
        return self._drawn[0] if self._drawn else None


class Coordinator:
    """The loop itself: draws prompt batches, keeps rollouts generating (ahead, with maxStaleness), learns
    on each batch in turn, and leaves cleanly on a stop. What a step reports and how the policy is
    evaluated live in `step_report` and `evaluation`; this class only decides when they happen."""

    def __init__(self, parts: LoopParts, start_step: int = 0, start_version: int = 0) -> None:
        self.p = parts
        self.spec = parts.spec
        self.settings = AlgorithmSettings.from_spec(parts.spec)
        self.step = start_step
        self.version = start_version
        self.total_steps = self._total_steps()
        self.evaluator = Evaluator(
            parts.eval_prompts, parts.dispatcher, parts.reward, self.reward_type, parts.status, parts.metrics
        )
        self.reporter = StepReporter(
            parts.status, parts.metrics, parts.on_step, parts.spec.training.tracking, self.total_steps, log
        )
        self.reward_errors = RewardErrorWatch(self.reward_type, parts.spec.data.reward_error_steps)
        self._last_step_end: float | None = None
        self._checkpointed_step = start_step
        self._rank0_rows: list[int] = []
        """The newest checkpoint's step (at first the one resumed from): a stop does not take it twice."""
        self.max_staleness = parts.spec.training.max_staleness if parts.async_capable else 0
        environment = parts.spec.data.environment
        if environment is not None:  # an episode is up to maxTurns turns and steps: its deadline says so
            parts.dispatcher.turns_per_item = environment.max_turns
            parts.dispatcher.step_timeout_s = environment.step_timeout_s
        if parts.spec.training.max_staleness and not parts.async_capable:
            log.warning(
                "training.maxStaleness needs rollout workers of their own (replicas >= 1); running on-policy"
            )

    def _total_steps(self) -> int:
        training = self.spec.training
        if training.steps is not None:
            return training.steps
        per_epoch = max(1, len(self.p.prompts) // self._prompts_per_step())
        return per_epoch * (training.epochs or 1)

    @property
    def reward_type(self) -> str:
        """The reward samples are scored with: an environment's episodes by the environment (replayed)."""
        return ENVIRONMENT_REWARD if self.spec.data.environment is not None else self.spec.data.reward_type

    def _prompts_per_step(self) -> int:
        return self.spec.training.batch_size * self.spec.roles.learner.replicas

    def sampling(self, greedy: bool = False) -> SamplingParams:
        data = self.spec.data
        return SamplingParams(
            max_new_tokens=data.max_new_tokens,
            temperature=0.0 if greedy else data.temperature,
            top_p=1.0 if greedy else data.top_p,
            top_k=0 if greedy else data.top_k,
            stop=tuple(data.stop),
            seed=self.spec.training.seed + self.step * 7919,
        )

    def _phase(self, name: str, timings: dict[str, float]) -> Callable[[], None]:
        self.p.status.update(phase=name)
        started = time.perf_counter()

        def done() -> None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - started

        return done

    # ---------------------------------------------------------------------------------------- eval
    async def evaluate(self) -> dict[str, float]:
        """The current policy's held-out evaluation (`Evaluator.evaluate`: once per policy version)."""
        return await self.evaluator.evaluate(self.step, self.version, self.sampling(greedy=True))

    @property
    def eval_history(self) -> list[tuple[int, float]]:
        """(step, accuracy) of every evaluation so far."""
        return self.evaluator.history

    # ---------------------------------------------------------------------------------------- step
    def next_items(self) -> list[tuple[Prompt, int]]:
        """The next prompt batch as (prompt, sample index) work items, groups numbered from 0."""
        parts, n = self.p, self.spec.algorithm.samples_per_prompt
        prompts = [
            dataclasses.replace(parts.prompts[i], group=group)
            for group, i in enumerate(parts.sampler.next_global_batch())
        ]
        return [(prompt, k) for prompt in prompts for k in range(n)]

    async def generate(self, items: list[tuple[Prompt, int]]) -> Generated:
        """Rollout and rewards for one batch, with the policy version current at launch."""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        version = self.version
        samples, report = await self.p.dispatcher.run(items, self.sampling(), version)
        timings["rollout"] = time.perf_counter() - started
        mark = time.perf_counter()
        scores = await self.p.reward.score(samples, self.reward_type)
        samples = [
            s.with_(score=score, score_reason=reason)
            for s, (score, reason) in zip(samples, scores, strict=True)
        ]
        timings["reward"] = time.perf_counter() - mark
        return Generated(items, samples, report, version, timings, started)

    async def run_step(self, generated: Generated | None = None) -> dict[str, Any]:
        """One step: rollout (unless already generated ahead, async RL), then learn on it."""
        if generated is None:
            self.p.status.update(phase="rollout")
            generated = await self.generate(self.next_items())
        return await self.learn(generated)

    async def learn(self, generated: Generated) -> dict[str, Any]:
        """Learn on one generated batch: choose the samples, update the policy on them, put the new weights
        out, then record the step (evaluating and checkpointing when due) and report it."""
        timings = dict(generated.timings)
        kept, stale_dropped, filter_metrics = self._choose(generated)
        refreshed = self.version  # the weights the learner holds, and sent the rollout workers
        metrics = await self._update_on(kept, timings) if kept else {}
        self.version += 1
        done = self._phase("weights", timings)
        await compute_thread.run(self.p.publish, self.version)
        done()
        self.step += 1
        elapsed = self._step_seconds(generated.started)
        record = step_record(
            step=self.step,
            version=self.version,
            samples=generated.samples,
            report=generated.report,
            expected_samples=len(generated.items),
            stale_dropped=stale_dropped,
            staleness=self.version - 1 - generated.version,
            step_seconds=elapsed,
            timings=timings,
            learned=(filter_metrics, metrics),
        )
        if self.spec.training.eval_every and self.step % self.spec.training.eval_every == 0:
            done = self._phase("eval", timings)
            record.update(await self.evaluate())
            done()
        record.update(await self._checkpoint_if_due(elapsed, timings))
        parity = measured_parity(metrics, refreshed)
        self.reporter.publish(self.step, self.version, record, timings, parity)
        self.reporter.log_samples(self.step, generated.samples)
        check_refit(  # after the step is on record: its metrics show what failed
            metrics,
            bound=self.spec.training.refit_parity_bound,
            samples=kept,
            row_max=getattr(self.p.trainer, "parity_rows", []),
            rows=self._rank0_rows,
            version=refreshed,
            learner=self.p.learner_name,
        )
        self.reward_errors.observe(self.step, record)
        return record

    def _choose(self, generated: Generated) -> tuple[list[Sample], int, dict[str, Any]]:
        """The samples this step learns from, how many were too stale, and the filters' metrics.

        Samples older than maxStaleness versions are dropped; fresher off-policy ones are importance-
        corrected against their behaviour log-probs (the rollout's own): by the loss's ratio, or with a
        rollout correction by its truncated weights / rejection (algorithms/rollout_correction.py).
        """
        fresh = [s for s in generated.samples if s.policy_version >= self.version - self.max_staleness]
        kept, filter_metrics = select_samples(fresh, self.settings)
        return self._even_for_learners(kept), len(generated.samples) - len(fresh), filter_metrics

    async def _update_on(self, kept: list[Sample], timings: dict[str, float]) -> dict[str, Any]:
        """Reference log-probs and critic values for the kept samples, advantages, the policy update, then
        the critic's own update on the returns; the update's metrics."""
        parts = self.p
        kept = await self._enrich(kept, timings)
        metrics: dict[str, Any] = {}
        done = self._phase("update", timings)
        batch = collate(kept, parts.pad_token_id)
        batch.parity_rows = torch.tensor(fresh_rows(kept, self.version), dtype=torch.bool)
        metrics.update(attach_advantages(batch, self.settings))
        metrics.update(await compute_thread.run(self._update, batch))
        done()
        if parts.critic is not None:
            done = self._phase("critic", timings)
            returns = [tuple(batch.returns[i, : len(s.response_ids)].tolist()) for i, s in enumerate(kept)]
            old = [s.values for s in kept]
            metrics["critic_loss"] = await parts.critic.train(kept, returns, old, self.version)
            done()
        return metrics

    async def _enrich(self, kept: list[Sample], timings: dict[str, float]) -> list[Sample]:
        """The samples with what the other models say about them: reference log-probs (for KL) and critic
        values (for GAE), each only when that role is in the job."""
        parts = self.p
        if parts.reference is not None:
            done = self._phase("reference", timings)
            ref = await parts.reference.logprobs(kept)
            kept = [s.with_(ref_logprobs=r) for s, r in zip(kept, ref, strict=True)]
            done()
        if parts.critic is not None:
            done = self._phase("critic", timings)
            values = await parts.critic.values(kept)
            kept = [s.with_(values=v) for s, v in zip(kept, values, strict=True)]
            done()
        return kept

    def _step_seconds(self, started: float) -> float:
        """The wall time this step added: from its rollout's launch, or from the previous step's end when
        the rollout was generated ahead while that step trained."""
        now = time.perf_counter()
        elapsed = now - max(started, self._last_step_end or started)
        self._last_step_end = now
        return elapsed

    async def _checkpoint_if_due(self, elapsed: float, timings: dict[str, float]) -> dict[str, Any]:
        """Take a snapshot when the checkpoint clock says one is due; the record's checkpoint fields."""
        clock, writer = self.p.checkpoint_clock, self.p.checkpoints
        if writer is None or clock is None:
            return {}
        now = time.monotonic()
        if not clock.due(self.step, self.total_steps, elapsed, writer.snapshot_seconds, now):
            return {}
        done = self._phase("checkpoint", timings)
        path = str(await asyncio.to_thread(writer.take, self.step, self.resume_state()))
        clock.taken(self.step, now)
        self._checkpointed_step = self.step
        self.p.status.update(last_checkpoint=path)
        fields = {
            "checkpoint": path,
            "checkpoint_snapshot_seconds": writer.snapshot_seconds,
            "checkpoint_write_seconds": writer.write_seconds,  # the previous one's, in the background
        }
        done()
        return fields

    def _even_for_learners(self, kept: list[Sample]) -> list[Sample]:
        """Data-parallel replicas must run the same number of micro-batches: trim to a multiple."""
        world = self.spec.roles.learner.replicas
        usable = len(kept) - len(kept) % world
        return kept[:usable]

    def _update(self, batch) -> dict[str, float]:
        world = self.spec.roles.learner.replicas
        if world == 1 or self.p.scatter is None:
            self._rank0_rows = list(range(batch.size))
            return self.p.trainer.update(batch)
        order = torch.arange(batch.size)
        self._rank0_rows = order[0::world].tolist()  # the rows rank 0's parity figures are of
        shards = [batch.select(order[r::world]) for r in range(world)]
        mine = self.p.scatter(shards)
        return self.p.trainer.update(mine)

    def resume_state(self, sampler: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a resumed loop continues from; `sampler` overrides the sampler's current state."""
        state = sampler if sampler is not None else self.p.sampler.state()
        return {"step": self.step, "policy_version": self.version, "sampler": state}

    # ------------------------------------------------------------------------------------------- stop
    def _stopping(self) -> bool:
        return self.p.stop is not None and self.p.stop.is_set()

    async def _unless_stopped(self, task: asyncio.Task[Generated]) -> Generated | None:
        """The batch `task` generates, or None when a stop comes first (the task is left to the caller)."""
        if self.p.stop is None:
            return await task
        waiter = asyncio.ensure_future(self.p.stop.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return task.result() if task.done() else None

    async def _leave(self, sampler: dict[str, Any] | None) -> None:
        """Checkpoint the last finished step (unless the clock just did), wait for it on disk, raise
        TrainingStopped. Prompts drawn for batches not learned from go back to the sampler's state."""
        status, writer = self.p.status, self.p.checkpoints
        status.update(phase="stopping")
        path = status.current.last_checkpoint or None
        if writer is not None:
            if self._checkpointed_step != self.step:
                path = str(await asyncio.to_thread(writer.take, self.step, self.resume_state(sampler)))
                status.update(last_checkpoint=path)
            await asyncio.to_thread(writer.flush)
        log.warning("stopping after step %d (SIGTERM); state in %s", self.step, path or "(no checkpoint)")
        raise TrainingStopped(self.step, path)

    # ------------------------------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Eval before, train to the end, eval after; returns the summary."""
        status = self.p.status
        status.update(state="Running", total_steps=self.total_steps, policy_version=self.version)
        if self.p.eval_prompts:
            status.update(phase="eval")  # the baseline evaluation: `dverl run` announces it while it lasts
        before = await self.evaluate() if self.p.eval_prompts else {}
        self.reporter.start_pace(self.step)
        rewards: list[float] = []
        """Each step's mean reward, for the summary's first and last windows."""
        started = time.perf_counter()
        ahead = _Ahead()
        launched = self.step
        try:
            while self.step < self.total_steps and not self._stopping():
                # Keep up to maxStaleness batches generating while this one trains (async RL);
                # with 0 the next rollout starts only after the new weights are out (on-policy).
                while launched < self.total_steps and len(ahead) < 1 + self.max_staleness:
                    drawn = self.p.sampler.state()
                    ahead.launch(drawn, asyncio.create_task(self.generate(self.next_items())))
                    launched += 1
                status.update(phase="rollout")
                generated = await self._unless_stopped(ahead.first())
                if generated is None:
                    break  # stopped while generating: this batch is dropped, its prompts handed back
                ahead.pop()
                record = await self.learn(generated)
                rewards.append(record["reward_mean"])
        except BaseException as exc:
            status.update(state="Failed", **failure_of(exc))
            ahead.cancel()
            raise
        if self._stopping():
            ahead.cancel()
            await self._leave(ahead.sampler_before())
        after = await self.evaluate() if self.p.eval_prompts else {}
        if self.p.checkpoints is not None:
            await asyncio.to_thread(self.p.checkpoints.flush)  # the last checkpoint is on disk
        summary = run_summary(
            steps=self.step,
            version=self.version,
            seconds=time.perf_counter() - started,
            rewards=rewards,
            before=before,
            after=after,
            last_checkpoint=status.current.last_checkpoint,
        )
        status.update(state="Succeeded", phase="done")
        return summary
