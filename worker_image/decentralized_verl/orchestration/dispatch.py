"""Throughput-weighted dispatch of generation work, with re-dispatch and exactly-once accounting.

Each step's work items are split across healthy rollout workers in proportion to their measured
tokens/s (a prior from the node pool's GPU type until measured), so a slow worker gets less work.
A worker that fails, answers out of contract or misses the deadline its own measured speed implies (a
hung or stopped worker) loses its unanswered items to the others and stays out of dispatch until its
Health says ready again (health.py); a sample is accepted once per (prompt, sample index), late or
repeated answers are counted and dropped. With every worker down, dispatch waits for one to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from decentralized_verl.core.interfaces import RolloutClient, WorkerFailure, WorkItem, closed_under_us
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.orchestration import continuation
from decentralized_verl.orchestration.health import HealthGate
from decentralized_verl.orchestration.hedging import late_after, probation_steps

log = logging.getLogger(__name__)

DEADLINE_FLOOR_S = 30.0
DEADLINE_FACTOR = 4.0
"""A share may take DEADLINE_FLOOR_S + DEADLINE_FACTOR x the time the worker's measured speed implies."""


def split_by_weight(n_items: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder split of n items by weight; every positive weight gets >= 1 when n allows."""
    total = sum(weights)
    if n_items <= 0 or total <= 0:
        return [0] * len(weights)
    raw = [n_items * w / total for w in weights]
    counts = [math.floor(x) for x in raw]
    order = sorted(range(len(weights)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in order[: n_items - sum(counts)]:
        counts[i] += 1
    # Make sure a worker is never starved entirely by rounding when there is enough work.
    for i, w in enumerate(weights):
        if w > 0 and counts[i] == 0 and n_items >= len(weights):
            donor = max(range(len(counts)), key=lambda j: counts[j])
            counts[donor] -= 1
            counts[i] += 1
    return counts


@dataclass
class WorkerStats:
    tokens_per_second: float
    measured: bool = False
    failures: int = 0
    items: int = 0

    def observe(self, tokens: int, seconds: float, alpha: float = 0.5) -> None:
        if seconds <= 0 or tokens <= 0:
            return
        rate = tokens / seconds
        self.tokens_per_second = (
            rate if not self.measured else alpha * rate + (1 - alpha) * self.tokens_per_second
        )
        self.measured = True


@dataclass
class DispatchReport:
    """What happened in one dispatch; the coordinator logs it and puts counters into metrics."""

    assigned: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    redispatched: int = 0
    hedged: int = 0
    """Items also given to a second worker because the first was late (the first answer is kept)."""
    continued: int = 0
    """Items given to another worker as a continuation of the prefix the first had sent."""
    duplicates_dropped: int = 0
    tokens: int = 0
    seconds: float = 0.0


class NoWorkersLeft(RuntimeError):
    pass


@dataclass
class _Step:
    """What one `Dispatcher.run` has so far, shared by every round, share and hedge of it: a sample is
    kept once per item whichever worker answers first, and a prefix one worker sent is where another
    continues the item."""

    sampling: SamplingParams
    version: int
    expected: set[tuple[str, int]]
    """Every item this step asked for: an answer to anything else is out of contract."""
    report: DispatchReport = field(default_factory=DispatchReport)
    results: dict[tuple[str, int], Sample] = field(default_factory=dict)
    partials: dict[tuple[str, int], Sample] = field(default_factory=dict)
    """Newest prefix sent for each unanswered item: where another worker continues it."""

    def missing(self, share: Sequence[WorkItem]) -> list[WorkItem]:
        """The items of a share not answered yet (by anyone)."""
        return [item for item in share if (item[0].prompt_id, item[1]) not in self.results]

    def accept(self, sample: Sample) -> bool:
        """Keep a prefix as its item's newest and a final answer the first time only (a repeat is counted
        and dropped); True when the sample was its item's first final answer."""
        if sample.finish_reason == "partial":
            if sample.key not in self.results:
                continuation.newer(self.partials, sample)
            return False
        if sample.key in self.results:
            self.report.duplicates_dropped += 1
            return False
        self.results[sample.key] = sample
        self.partials.pop(sample.key, None)
        return True


class Dispatcher:
    def __init__(
        self,
        clients: Sequence[RolloutClient],
        priors: dict[str, float] | None = None,
        max_rounds: int = 5,
        *,
        wait_s: float = 900.0,
    ) -> None:
        self.clients = {c.worker_id: c for c in clients}
        self.gate = HealthGate()
        self.wait_s = wait_s
        """How long a step waits for a worker to come back when every one is down."""
        self.stats = {
            wid: WorkerStats(tokens_per_second=(priors or {}).get(wid, 1.0)) for wid in self.clients
        }
        self.max_rounds = max_rounds
        self.turns_per_item = 1
        """Model turns an item may take (an episode's `maxTurns`), each up to `max_new_tokens` long."""
        self.step_timeout_s = 0.0
        """How long one environment step may take; a share's episodes step together, once a turn."""
        self._hedge_worker: dict[asyncio.Future, str] = {}
        self._strikes: dict[str, int] = {}
        """Worker id -> shares in a row that were late and hedged."""
        self._skip: dict[str, int] = {}
        """Worker id -> steps it still sits out."""

    def add(self, client: RolloutClient, prior: float = 1.0) -> None:
        """Volunteers and replaced workers join between dispatches."""
        self.clients[client.worker_id] = client
        self.stats.setdefault(client.worker_id, WorkerStats(tokens_per_second=prior))

    def remove(self, worker_id: str) -> None:
        self.clients.pop(worker_id, None)
        self.gate.forget(worker_id)

    def expected(self, worker_id: str, n_items: int, sampling: SamplingParams) -> float | None:
        """Seconds a share should take at the worker's measured speed (its link included: the speed is
        tokens over the wall time of its past shares); None until it has been measured."""
        stats = self.stats.get(worker_id)
        if stats is None or not stats.measured:
            return None
        tokens = n_items * sampling.max_new_tokens * self.turns_per_item
        return tokens / max(stats.tokens_per_second, 1e-6) + self._environment_seconds()

    def _environment_seconds(self) -> float:
        """The most an episode's environment steps may take: every turn's step at its timeout."""
        return self.turns_per_item * self.step_timeout_s

    def deadline(self, worker_id: str, n_items: int, sampling: SamplingParams) -> float | None:
        """Seconds a share may take: a generous multiple of the generation time the worker's measured
        speed implies (so a worker that stops answering is noticed) plus every environment step at its
        own timeout (already a bound, not multiplied), None until the worker has been measured."""
        expected = self.expected(worker_id, n_items, sampling)
        if expected is None:
            return None
        environment = self._environment_seconds()
        return DEADLINE_FLOOR_S + DEADLINE_FACTOR * (expected - environment) + environment

    def _weights(self, healthy: list[str]) -> list[float]:
        return [max(self.stats[w].tokens_per_second, 1e-6) for w in healthy]

    async def run(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> tuple[list[Sample], DispatchReport]:
        """Generate every item exactly once; raises NoWorkersLeft if every worker failed."""
        started = time.perf_counter()
        step = _Step(sampling, version, expected={(p.prompt_id, i) for p, i in items})
        report = step.report
        pending = list(items)
        healthy = self._off_probation(list(self.clients))
        rounds = 0
        while pending:
            healthy = self.gate.up(wid for wid in healthy if wid in self.clients)
            # Every worker failed or is restarting: wait for one to answer its Health again.
            if (
                not healthy
                and rounds < self.max_rounds
                and await self.gate.wait_any(self.clients, self.wait_s)
            ):
                healthy = self.gate.up(self.clients)
            if not healthy or rounds >= self.max_rounds:
                raise NoWorkersLeft(
                    f"{len(pending)} items unanswered after {rounds} rounds; failures: {report.failures}"
                )
            rounds += 1
            counts = split_by_weight(len(pending), self._weights(healthy))
            shares: list[tuple[str, list[WorkItem]]] = []
            offset = 0
            # Capture the clients now: discovery may remove a volunteer while this round runs.
            clients = {wid: self.clients[wid] for wid in healthy}
            for wid, count in zip(healthy, counts, strict=True):
                if count:
                    shares.append((wid, pending[offset : offset + count]))
                    report.assigned[wid] = report.assigned.get(wid, 0) + count
                offset += count
            outcomes = await self._round(clients, shares, step)
            pending = []
            for (wid, share), failed in zip(shares, outcomes, strict=True):
                if failed:
                    healthy.remove(wid)
                    missing = step.missing(share)
                    report.redispatched += len(missing)
                    pending.extend(missing)
        report.seconds = time.perf_counter() - started
        ordered = [step.results[(p.prompt_id, i)] for p, i in items]
        return ordered, report

    async def _round(
        self,
        clients: dict[str, RolloutClient],
        shares: list[tuple[str, list[WorkItem]]],
        step: _Step,
    ) -> list[bool]:
        """Run one round's shares; whether each one's worker failed.

        A share still running well past what its worker's measured speed implies (`hedging.late_after`)
        is hedged: its unanswered items also go to a worker that finished its own share, and whichever
        answers first is kept (the other's answer is counted as a duplicate and dropped), so a worker
        that went slow or silent, cut off by a partition or a slow link, holds the step seconds, not
        until its deadline. Once every item of the round is answered, shares still running are cancelled;
        the workers of hedged ones are held out until their Health answers (a stopped worker stays out; a
        volunteer, which cannot be probed, is left to discovery); none is counted as failed. An item whose
        worker sent a prefix before going late or failing is continued from that prefix
        (`continuation.py`), not generated again."""
        started = time.monotonic()
        main = {
            asyncio.ensure_future(self._share(clients[wid], share, step)): k
            for k, (wid, share) in enumerate(shares)
        }
        outcomes: list[bool] = [False] * len(shares)
        idle: list[str] = []
        extra: set[asyncio.Future] = set()
        hedged: set[int] = set()
        wanted = {(p.prompt_id, i) for _, share in shares for p, i in share}
        running = set(main)
        try:
            while running:
                # Only shares still running can be hedged: one that finished must not set the wait's
                # timeout (its time long past, the wait would return at once, over and over, a busy loop).
                unfinished = {k for task, k in main.items() if not task.done()}
                late = {
                    k: late_after(self.expected(wid, len(share), step.sampling))
                    for k, (wid, share) in enumerate(shares)
                    if k not in hedged and k in unfinished
                }
                due = [started + t for t in late.values() if t is not None]
                timeout = max(0.0, min(due) - time.monotonic()) if due and idle else None
                done, running = await asyncio.wait(
                    running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task in main:
                        k = main[task]
                        outcomes[k] = task.result()
                        if not outcomes[k]:
                            idle.append(shares[k][0])
                    elif not task.result():
                        idle.append(self._hedge_worker[task])
                if wanted <= step.results.keys():
                    break
                now = time.monotonic() - started
                for k, after in late.items():
                    if after is None or now < after or not idle:
                        continue
                    wid, share = shares[k]
                    main_task = next(t for t, j in main.items() if j == k)
                    missing = step.missing(share)
                    if main_task.done() or not missing:
                        continue
                    helper = idle.pop(0)
                    hedged.add(k)
                    step.report.hedged += len(missing)
                    log.info(
                        "share of %s is late (%.1fs): hedging %d items on %s", wid, now, len(missing), helper
                    )
                    task = asyncio.ensure_future(self._share(clients[helper], missing, step))
                    self._hedge_worker[task] = helper
                    extra.add(task)
                    running.add(task)
        finally:
            for task in running:
                task.cancel()
                # Late and outdone: held out until its Health answers (a stopped worker). A share that was
                # never hedged had every item answered by its own worker, only its stream's end was still
                # on the way (a busy machine): that worker was on time and keeps its place.
                if task in main and main[task] in hedged:
                    wid = shares[main[task]][0]
                    self.gate.mark_down(wid, clients[wid])
                    self._strikes[wid] = strikes = self._strikes.get(wid, 0) + 1
                    self._skip[wid] = probation_steps(strikes)
            for task in running:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for task in extra:
                self._hedge_worker.pop(task, None)
        return outcomes

    def _off_probation(self, workers: list[str]) -> list[str]:
        """The workers this step may use: one whose share was late and hedged sits out a few steps
        (`hedging.probation_steps`, doubling while it stays late) so a partitioned volunteer, which
        cannot be probed, does not cost every step the hedge's wait; never all of them."""
        benched = {w for w in workers if self._skip.get(w, 0) > 0}
        for w in benched:
            self._skip[w] -= 1
        usable = [w for w in workers if w not in benched]
        return usable or workers

    def _failed(self, client: RolloutClient, reason: str, report: DispatchReport) -> bool:
        """Count the failure, hold the worker out until it is healthy again; True (it failed)."""
        wid = client.worker_id
        self.stats.setdefault(wid, WorkerStats(tokens_per_second=1.0)).failures += 1
        report.failures.append(f"{wid}: {reason}")
        log.warning("rollout worker %s failed: %s; re-dispatching its unanswered items", wid, reason)
        if wid in self.clients:
            self.gate.mark_down(wid, client)
        return True

    async def _share(
        self,
        client: RolloutClient,
        share: list[WorkItem],
        step: _Step,
    ) -> bool:
        """Run one worker's share, items with a prefix as continuations of it; True when it failed."""
        for group in continuation.groups(share, step.partials, step.sampling):
            if group.prefixes:
                step.report.continued += len(group.prefixes)
                log.info(
                    "%s continues %d items from their %d-token prefixes",
                    client.worker_id,
                    len(group.prefixes),
                    len(next(iter(group.prefixes.values())).response_ids),
                )
            failed = await self._one(client, group.items, group.sampling, step, group.prefixes)
            if failed:
                return True
        return False

    async def _one(
        self,
        client: RolloutClient,
        share: list[WorkItem],
        sampling: SamplingParams,
        step: _Step,
        prefixes: dict[tuple[str, int], Sample],
    ) -> bool:
        """Run one call of a worker's share with `sampling` (its group's: a continuation generates only
        what its prefix left); True when the worker failed. A prefix it sends is kept in the step's
        `partials`; an answer to an item of `prefixes` is stitched onto that prefix."""
        wid = client.worker_id
        stats = self.stats.setdefault(wid, WorkerStats(tokens_per_second=1.0))
        started = time.perf_counter()
        tokens = 0
        wanted = {(p.prompt_id, i) for p, i in share}
        report = step.report
        try:
            async with asyncio.timeout(self.deadline(wid, len(share), sampling)):
                async for sample in client.generate(share, sampling, step.version):
                    if sample.key not in wanted or sample.key not in step.expected:
                        raise WorkerFailure(wid, f"answered an item it was not given: {sample.key}")
                    generated = len(sample.response_ids)
                    if sample.key in prefixes:
                        sample = continuation.stitch(prefixes[sample.key], sample)
                    if step.accept(sample):
                        tokens += generated
            missing = wanted - step.results.keys()
            if missing:
                raise WorkerFailure(wid, f"stream ended with {len(missing)} items unanswered")
        except WorkerFailure as exc:
            return self._failed(client, exc.reason, report)
        except TimeoutError:
            deadline = self.deadline(wid, len(share), sampling)
            return self._failed(client, f"no answer within the {deadline:.0f}s its speed allows", report)
        except (ConnectionError, OSError) as exc:
            return self._failed(client, repr(exc), report)
        except asyncio.CancelledError:
            if not closed_under_us():
                raise  # this step itself is being cancelled
            # The worker was removed (its channel closed) while it held work: its failure, not the step's.
            return self._failed(client, "removed while generating", report)
        finally:
            report.tokens += tokens
        stats.items += len(share)
        self._strikes.pop(wid, None)  # on time again: no longer on probation
        stats.observe(tokens, time.perf_counter() - started)
        return False
