"""The training loop of learner rank 0 (docs/internals.md, "How one training step flows").

prompts -> rollout (dispatched by throughput) -> rewards -> reference / critic -> filters and advantages
-> data-parallel update -> new weights out -> metrics, status, checkpoint, eval. The roles are reached
through the protocols in `core.interfaces`, whether they are remote workers or colocated in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.core.interfaces import CriticClient, ReferenceClient, RewardClient
from decentralized_verl.core.samples import Prompt, Sample, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.status import StatusBoard
from decentralized_verl.environments.metrics import episode_metrics
from decentralized_verl.environments.replay import ENVIRONMENT_REWARD
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.reporting.metrics import MetricsLog
from decentralized_verl.reporting.progress import eta_seconds, progress_line
from decentralized_verl.reporting.stats import wilson_interval
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


class TrainingStopped(Exception):
    """The loop was asked to stop; `checkpoint` is where it left its state (None: nothing new to keep)."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"stopped after step {step}; state in {checkpoint or '(no new checkpoint)'}")


@dataclass
class Generated:
    """One batch's rollout and rewards, possibly produced ahead of the step that learns on it."""

    items: list[tuple[Prompt, int]]
    samples: list[Sample]
    report: Any
    version: int
    timings: dict[str, float]
    started: float


class Coordinator:
    def __init__(self, parts: LoopParts, start_step: int = 0, start_version: int = 0) -> None:
        self.p = parts
        self.spec = parts.spec
        self.settings = AlgorithmSettings.from_spec(parts.spec)
        self.step = start_step
        self.version = start_version
        self.total_steps = self._total_steps()
        self.eval_history: list[tuple[int, float]] = []
        self._last_eval: tuple[int, dict[str, float]] | None = None
        """(policy version, result) of the latest evaluation: the same policy is not evaluated twice."""
        self._last_step_end: float | None = None
        self._pace_from: tuple[int, float] | None = None
        """(step, monotonic time) the run started at, for the ETA of the per-step progress line."""
        self._checkpointed_step = start_step
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
        """Greedy answers on the held-out prompts; accuracy = share of fully correct answers.

        A policy version already evaluated (the last step's periodic evaluation when `evalEvery` divides
        the steps, then the final one) returns that result again without generating or writing a second
        row: greedy answers of the same weights are the same answers.
        """
        if not self.p.eval_prompts:
            return {}
        if self._last_eval is not None and self._last_eval[0] == self.version:
            return dict(self._last_eval[1])
        items = [(prompt, 0) for prompt in self.p.eval_prompts]
        samples, _ = await self.p.dispatcher.run(items, self.sampling(greedy=True), self.version)
        scores = await self.p.reward.score(samples, self.reward_type)
        values = [s for s, _ in scores]
        correct = sum(1 for v in values if v >= 1.0 - 1e-6)
        accuracy = correct / len(values)
        low, high = wilson_interval(correct, len(values))
        self.eval_history.append((self.step, accuracy))
        self.p.status.update(eval_accuracy=accuracy)
        result = {
            "eval_accuracy": accuracy,
            "eval_accuracy_low": low,
            "eval_accuracy_high": high,
            "eval_problems": len(values),
            "eval_reward_mean": statistics.fmean(values),
        }
        if self.p.metrics is not None:  # every evaluation, the one before training (step 0) too
            self.p.metrics.write_eval({"step": self.step, **result})
        self._last_eval = (self.version, dict(result))
        return result

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
        parts = self.p
        timings = dict(generated.timings)
        started = generated.started
        items, report = generated.items, generated.report
        # Samples older than maxStaleness versions are dropped; fresher off-policy ones are importance-
        # corrected against their behaviour log-probs (the rollout's own): by the loss's ratio, or with a
        # rollout correction by its truncated weights / rejection (algorithms/rollout_correction.py).
        fresh = [s for s in generated.samples if s.policy_version >= self.version - self.max_staleness]
        stale_dropped = len(generated.samples) - len(fresh)
        samples = fresh
        rewards = [float(s.score or 0.0) for s in generated.samples]

        kept, filter_metrics = select_samples(samples, self.settings)
        kept = self._even_for_learners(kept)
        metrics: dict[str, Any] = {}
        if kept:
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
            done = self._phase("update", timings)
            batch = collate(kept, parts.pad_token_id)
            metrics.update(attach_advantages(batch, self.settings))
            metrics.update(await compute_thread.run(self._update, batch))
            done()
            if parts.critic is not None:
                done = self._phase("critic", timings)
                returns = [
                    tuple(batch.returns[i, : len(s.response_ids)].tolist()) for i, s in enumerate(kept)
                ]
                old = [s.values for s in kept]
                metrics["critic_loss"] = await parts.critic.train(kept, returns, old, self.version)
                done()
        self.version += 1
        done = self._phase("weights", timings)
        await compute_thread.run(parts.publish, self.version)
        done()
        self.step += 1

        lengths = [len(s.response_ids) for s in generated.samples]
        now = time.perf_counter()
        elapsed = now - max(started, self._last_step_end or started)  # wall time this step added
        self._last_step_end = now
        record: dict[str, Any] = {
            "step": self.step,
            "policy_version": self.version,
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "response_length_mean": statistics.fmean(lengths),
            "truncated_frac": sum(s.finish_reason == "length" for s in generated.samples)
            / len(generated.samples),
            "tokens": report.tokens,
            "tokens_per_second": report.tokens / max(report.seconds, 1e-9),
            "step_seconds": elapsed,
            "redispatched": report.redispatched,
            "hedged": report.hedged,
            "continued": report.continued,
            "worker_failures": len(report.failures),
            "rollout_workers": len(report.assigned),
            "samples_by_worker": _samples_by_worker(generated.samples),
            "samples": len(generated.samples),
            "expected_samples": len(items),
            "stale_dropped": stale_dropped,
            "staleness": self.version - 1 - generated.version,
            "unique_samples": len({s.key for s in generated.samples}),
            "duplicates_dropped": report.duplicates_dropped,
            **{f"time_{k}": v for k, v in timings.items()},
            **episode_metrics(generated.samples),
            **filter_metrics,
            **metrics,
        }
        if self.spec.training.eval_every and self.step % self.spec.training.eval_every == 0:
            done = self._phase("eval", timings)
            record.update(await self.evaluate())
            done()
        clock, writer = parts.checkpoint_clock, parts.checkpoints
        if writer is not None and clock is not None:
            now = time.monotonic()
            if clock.due(self.step, self.total_steps, elapsed, writer.snapshot_seconds, now):
                done = self._phase("checkpoint", timings)
                path = str(await asyncio.to_thread(writer.take, self.step, self.resume_state()))
                clock.taken(self.step, now)
                self._checkpointed_step = self.step
                parts.status.update(last_checkpoint=path)
                record["checkpoint"] = path
                record["checkpoint_snapshot_seconds"] = writer.snapshot_seconds
                record["checkpoint_write_seconds"] = (
                    writer.write_seconds
                )  # the previous one's, in the background
                done()
        self._publish_progress(record, timings)
        self._log_samples(generated.samples)
        return record

    def _log_samples(self, samples: Sequence[Sample]) -> None:
        """Every `tracking.samplesEvery` steps, a few generations as a table (what a person reads to see
        what the numbers mean)."""
        tracking = self.spec.training.tracking
        if self.p.metrics is None or not tracking.samples_every or self.step % tracking.samples_every:
            return
        rows = [
            {"prompt": s.prompt.text, "response": s.text, "reward": s.score}
            for s in list(samples)[: tracking.samples]
        ]
        self.p.metrics.write_samples(self.step, rows)

    def _even_for_learners(self, kept: list[Sample]) -> list[Sample]:
        """Data-parallel replicas must run the same number of micro-batches: trim to a multiple."""
        world = self.spec.roles.learner.replicas
        usable = len(kept) - len(kept) % world
        return kept[:usable]

    def _update(self, batch) -> dict[str, float]:
        import torch

        world = self.spec.roles.learner.replicas
        if world == 1 or self.p.scatter is None:
            return self.p.trainer.update(batch)
        order = torch.arange(batch.size)
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

    def _publish_progress(self, record: dict[str, Any], timings: dict[str, float]) -> None:
        self.p.status.update(
            step=self.step,
            total_steps=self.total_steps,
            reward_mean=record["reward_mean"],
            reward_std=record["reward_std"],
            kl=float(record.get("kl", 0.0)),
            response_length_mean=record["response_length_mean"],
            policy_version=self.version,
            tokens_per_second=record["tokens_per_second"],
            phase_seconds=tuple(sorted(timings.items())),
            phase="idle",
        )
        log.info(self._progress_line(record))
        if self.p.metrics is not None:
            self.p.metrics.write({"time": time.time(), **record})
        if self.p.on_step is not None:
            self.p.on_step(record)

    def _progress_line(self, record: dict[str, Any]) -> str:
        """The step's line in the learner log (a pod log has no progress bar)."""
        first_step, since = self._pace_from or (self.step - 1, time.monotonic())
        eta = eta_seconds(self.step, self.total_steps, time.monotonic() - since, first_step)
        return progress_line(
            self.step,
            self.total_steps,
            record.get("reward_mean"),
            record.get("tokens_per_second"),
            eta,
            accuracy=record.get("eval_accuracy"),
        )

    # ------------------------------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Eval before, train to the end, eval after; returns the summary."""
        status = self.p.status
        status.update(state="Running", total_steps=self.total_steps, policy_version=self.version)
        before = await self.evaluate() if self.p.eval_prompts else {}
        self._pace_from = (self.step, time.monotonic())
        first_rewards: list[float] = []
        last_rewards: list[float] = []
        started = time.perf_counter()
        ahead: deque[asyncio.Task[Generated]] = deque()
        drawn: deque[dict[str, Any]] = deque()
        """The sampler's state before each batch in `ahead` was drawn: a stop hands those prompts back."""
        launched = self.step
        try:
            while self.step < self.total_steps and not self._stopping():
                # Keep up to maxStaleness batches generating while this one trains (async RL);
                # with 0 the next rollout starts only after the new weights are out (on-policy).
                while launched < self.total_steps and len(ahead) < 1 + self.max_staleness:
                    drawn.append(self.p.sampler.state())
                    ahead.append(asyncio.create_task(self.generate(self.next_items())))
                    launched += 1
                status.update(phase="rollout")
                generated = await self._unless_stopped(ahead[0])
                if generated is None:
                    break  # stopped while generating: this batch is dropped, its prompts handed back
                ahead.popleft()
                drawn.popleft()
                record = await self.learn(generated)
                first_rewards.append(record["reward_mean"])
                last_rewards.append(record["reward_mean"])
        except BaseException:
            status.update(state="Failed")
            for task in ahead:
                task.cancel()
            raise
        if self._stopping():
            for task in ahead:
                task.cancel()
            await self._leave(drawn[0] if drawn else None)
        after = await self.evaluate() if self.p.eval_prompts else {}
        if self.p.checkpoints is not None:
            await asyncio.to_thread(self.p.checkpoints.flush)  # the last checkpoint is on disk
        window = max(1, min(5, len(first_rewards) // 3 or 1))
        summary = {
            "steps": self.step,
            "policy_version": self.version,
            "seconds": time.perf_counter() - started,
            "reward_first": statistics.fmean(first_rewards[:window]) if first_rewards else math.nan,
            "reward_last": statistics.fmean(last_rewards[-window:]) if last_rewards else math.nan,
            "eval_accuracy_before": before.get("eval_accuracy"),
            "eval_accuracy_after": after.get("eval_accuracy"),
            "eval_interval_before": _interval(before),
            "eval_interval_after": _interval(after),
            "eval_problems": after.get("eval_problems") or before.get("eval_problems"),
            "last_checkpoint": status.current.last_checkpoint,
        }
        status.update(state="Succeeded", phase="done")
        return summary


def _interval(evaluation: dict[str, Any]) -> list[float] | None:
    """The 95% interval of an evaluation's accuracy, for the summary."""
    if "eval_accuracy_low" not in evaluation:
        return None
    return [evaluation["eval_accuracy_low"], evaluation["eval_accuracy_high"]]


def _samples_by_worker(samples: Sequence[Sample]) -> dict[str, int]:
    """How many of a step's samples each worker produced, so a slow peer's share shows every step."""
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample.worker_id] = counts.get(sample.worker_id, 0) + 1
    return counts
