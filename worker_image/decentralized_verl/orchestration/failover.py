"""Reward, reference and critic calls that survive a dead, hung, refusing or lying worker.

Reward and reference are stateless, so a call is split across the replicas that are up (as rollout work
is) and a share whose worker fails goes to another replica, or, with one replica, waits for it to be
ready again (restarted), with backoff, up to a deadline; only past the deadline does the step fail. A
worker that fails, misses the deadline its measured speed implies, or answers out of contract is held
out until its Health says ready (health.py). The critic is one model being trained: every call goes to
one replica (the first that is up) and fails over in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.core.interfaces import WorkerFailure, closed_under_us
from decentralized_verl.core.samples import Sample
from decentralized_verl.orchestration.dispatch import split_by_weight
from decentralized_verl.orchestration.health import HealthGate

log = logging.getLogger(__name__)

CALL_FLOOR_S = 30.0
CALL_FACTOR = 4.0
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0


@dataclass
class _Speed:
    """Seconds per sample, measured (EMA); bounds how long a call may take."""

    per_sample: float | None = None

    def observe(self, n: int, seconds: float) -> None:
        if n > 0:
            rate = seconds / n
            self.per_sample = rate if self.per_sample is None else 0.5 * rate + 0.5 * self.per_sample

    def timeout(self, n: int) -> float | None:
        return None if self.per_sample is None else CALL_FLOOR_S + CALL_FACTOR * self.per_sample * n


@dataclass
class PoolReport:
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    retried: int = 0


class ScoringPool:
    """One scoring role's replicas behind the role's client protocol (score / logprobs / values / train)."""

    def __init__(self, role: str, clients: Sequence[Any], *, split: bool, deadline_s: float = 900.0) -> None:
        if not clients:
            raise ValueError(f"{role}: a scoring pool needs at least one worker")
        self.role = role
        self.clients = {c.worker_id: c for c in clients}
        self.split = split
        self.deadline_s = deadline_s
        self.gate = HealthGate()
        self.speed = {wid: _Speed() for wid in self.clients}
        self.report = PoolReport()

    # -- the role protocols
    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        return await self._call("score", list(samples), reward_type)

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return await self._call("logprobs", list(samples))

    async def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return await self._call("values", list(samples))

    async def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int,
    ) -> float:
        return await self._call("train", list(samples), returns, old_values, policy_version, whole=True)

    async def close(self) -> None:
        await self.gate.close()
        for client in self.clients.values():
            await client.close()

    # -- failover
    async def _call(self, method: str, samples: list[Sample], *args: Any, whole: bool = False) -> Any:
        """Every sample answered once; shares re-sent until the deadline. `whole`: one call, one answer."""
        self.report.calls += 1
        deadline = time.monotonic() + self.deadline_s
        results: dict[int, Any] = {}
        pending = list(range(len(samples)))
        answer: list[Any] = []
        retry = RETRY_FIRST_S
        while pending or (whole and not answer):
            up = self.gate.up(self.clients)
            if not (self.split and not whole):
                up = up[:1]  # one model: the first replica that is up, in order
            if not up:
                left = deadline - time.monotonic()
                if left <= 0 or not await self.gate.wait_any(self.clients, left):
                    raise self._exhausted()
                continue
            shares = self._shares(up, pending)
            outcomes = await asyncio.gather(
                *(
                    self._one(wid, method, samples, share, args, results, answer, whole)
                    for wid, share in shares
                )
            )
            pending = [i for (wid, share), ok in zip(shares, outcomes, strict=True) if not ok for i in share]
            if pending or (whole and not answer):
                self.report.retried += 1
                if time.monotonic() + retry > deadline:
                    raise self._exhausted()
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
        return answer[0] if whole else [results[i] for i in range(len(samples))]

    def _shares(self, up: list[str], pending: list[int]) -> list[tuple[str, list[int]]]:
        counts = split_by_weight(len(pending), [1.0] * len(up)) if len(up) > 1 else [len(pending)]
        shares, offset = [], 0
        for wid, count in zip(up, counts, strict=True):
            if count or not pending:
                shares.append((wid, pending[offset : offset + count]))
            offset += count
        return shares

    async def _one(
        self,
        wid: str,
        method: str,
        samples: list[Sample],
        share: list[int],
        args: tuple[Any, ...],
        results: dict[int, Any],
        answer: list[Any],
        whole: bool,
    ) -> bool:
        client = self.clients[wid]
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.speed[wid].timeout(len(share))):
                got = await getattr(client, method)([samples[i] for i in share], *args)
        except WorkerFailure as exc:
            return self._failed(wid, exc.reason)
        except TimeoutError:
            return self._failed(wid, "no answer within the time its measured speed allows")
        except (ConnectionError, OSError) as exc:
            return self._failed(wid, repr(exc))
        except asyncio.CancelledError:
            if not closed_under_us():
                raise
            return self._failed(wid, "its channel closed during the call")
        self.speed[wid].observe(len(share), time.monotonic() - began)
        if whole:
            answer.append(got)
        else:
            results.update(zip(share, got, strict=True))
        return True

    def _failed(self, wid: str, reason: str) -> bool:
        self.report.failures.append(f"{wid}: {reason}")
        log.warning(
            "%s worker %s failed: %s; trying again elsewhere or once it is back", self.role, wid, reason
        )
        self.gate.mark_down(wid, self.clients[wid])
        return False

    def _exhausted(self) -> WorkerFailure:
        recent = "; ".join(self.report.failures[-3:])
        return WorkerFailure(
            self.role, f"no {self.role} worker answered within {self.deadline_s:g}s (last failures: {recent})"
        )
