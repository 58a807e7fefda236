"""One gradient all-reduce with every expected learner, or a loud failure: never a step alone.

hivemind.Optimizer falls back to local gradients ("Proceeding with local gradients") whenever
matchmaking comes back short or the all-reduce fails, and its progress tracker can let a peer step
before its groupmates are matchmaking at all (the race that once left a learner in a group of 1). So
the volunteer learner drives hivemind's `GradientAverager` (the averaging engine inside
hivemind.Optimizer) itself, and checks three things every step:

1. group size: `min_group_size = target_group_size = peers`, so hivemind's matchmaking never assembles a
   smaller group (it keeps looking until the timeout), and the gathered metadata must name exactly
   `peers` learners of this job at this step;
2. same step: every member gathered the same job and step number;
3. by value: each member gathers a fingerprint of its local gradient (a seeded projection per tensor);
   the averaged gradient's fingerprint must equal the weighted mean of the members' fingerprints. A
   part of the all-reduce that silently failed (hivemind keeps local values for it and only logs
   "received N% results") shifts the projection by far more than float32 rounding can.

A failed or short round is retried with the local gradients reloaded until `deadline_s`; then
VolunteerError.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from decentralized_verl.errors import VolunteerError

log = logging.getLogger(__name__)

FINGERPRINT_RTOL = 1e-4
"""Float32 rounding of an N-peer average moves the projection by ~N * 6e-8 of its L2 scale; a failed
all-reduce part of k out of n elements moves it by ~sqrt(k / n), which hivemind's parts keep large."""


def _weights(n: int, seed: int, index: int) -> torch.Tensor:
    """Deterministic pseudo-random weights in [-0.5, 0.5), the same on every machine and torch version."""
    j = torch.arange(n, dtype=torch.int64)
    h = (j * 40503 + (seed % 65521) * 7919 + index * 104729) % 2147483647
    h = (h * 48271) % 2147483647
    h = (h * 48271) % 2147483647
    return h.to(torch.float64) / 2147483647.0 - 0.5


def fingerprint(tensors: Sequence[torch.Tensor], seed: int) -> list[tuple[float, float]]:
    """(projection, L2 scale) per tensor: (sum r*t, ||r*t||) in float64 with `_weights` as r."""
    out = []
    for i, t in enumerate(tensors):
        x = t.detach().reshape(-1).to(torch.float64).cpu()
        rx = x * _weights(x.numel(), seed, i)
        out.append((float(rx.sum()), float(rx.norm())))
    return out


def check_average(
    averaged: Sequence[tuple[float, float]],
    members: Sequence[tuple[float, Sequence[tuple[float, float]]]],
    *,
    rtol: float = FINGERPRINT_RTOL,
) -> list[str]:
    """Problems (none when fine) comparing the averaged fingerprint with the members' weighted mean."""
    total = sum(w for w, _ in members)
    if total <= 0:
        return ["the group's total weight is not positive"]
    problems = []
    for i, (proj, scale) in enumerate(averaged):
        parts = [fp[i] for _, fp in members]
        expected = sum(w * p for (w, _), (p, _) in zip(members, parts, strict=True)) / total
        bound = rtol * max([scale] + [s for _, s in parts]) + 1e-30
        if not math.isfinite(proj) or abs(proj - expected) > bound:
            problems.append(f"tensor {i}: projection {proj:.9g}, expected {expected:.9g} (+- {bound:.3g})")
    return problems


def _peer_name(peer: Any) -> str:
    return peer.to_base58() if hasattr(peer, "to_base58") else str(peer)


@dataclass(frozen=True)
class Averaged:
    members: tuple[str, ...]
    """Peer ids (base58) of the group, sorted."""
    reachable: tuple[str, ...]
    """The members that accept inbound streams (not client mode): candidates to lead the parameter sync."""
    attempts: int
    seconds: float


def check_group(gathered: dict[str, dict[str, Any]], *, job: str, epoch: int, peers: int) -> list[str]:
    """Problems with the group's gathered metadata (size, job, step, a fingerprint per member)."""
    problems = []
    if len(gathered) != peers:
        problems.append(f"group of {len(gathered)} learners, expected {peers}")
    for peer_id, data in sorted(gathered.items()):
        if not isinstance(data, dict):
            problems.append(f"{peer_id}: no metadata")
            continue
        if data.get("job") != job or data.get("epoch") != epoch:
            problems.append(f"{peer_id}: is at job {data.get('job')!r} step {data.get('epoch')}")
        if not isinstance(data.get("fingerprint"), list) or not isinstance(data.get("weight"), int | float):
            problems.append(f"{peer_id}: no gradient fingerprint")
    return problems


def average_with_group(
    averager,
    *,
    job: str,
    epoch: int,
    peers: int,
    weight: float,
    client_mode: bool = False,
    round_timeout_s: float,
    allreduce_timeout_s: float,
    deadline_s: float,
) -> Averaged:
    """All-reduce the averager's accumulated gradients with exactly `peers` learners at step `epoch`.

    On success the averager's tensors hold the group's weighted mean gradient; the accumulators are
    left untouched (the caller resets them after using the result).
    """
    averager.load_accumulators_into_averager_()
    with torch.no_grad(), averager.get_tensors() as tensors:
        local = fingerprint(tensors, epoch)
    gather = {
        "job": job,
        "epoch": epoch,
        "weight": float(weight),
        "client": bool(client_mode),
        "fingerprint": [list(x) for x in local],
    }
    began = time.monotonic()
    attempts = 0
    last = ""
    while time.monotonic() - began < deadline_s:
        attempts += 1
        timeout = max(1.0, min(round_timeout_s, deadline_s - (time.monotonic() - began)))
        # step() reloads the accumulators into the averager's buffer, so a retry starts from the local
        # gradient again, never from a half-reduced buffer.
        control = averager.step(
            weight=float(weight), reset_accumulators=False, timeout=timeout, gather=gather, wait=False
        )
        try:
            result = control.result(timeout + allreduce_timeout_s)
        except Exception as exc:  # no full group in time, or the all-reduce broke: reload and retry
            control.cancel()
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning("step %d: averaging attempt %d failed (%s); retrying", epoch, attempts, last)
            continue
        if result is None:
            last = "no group formed"
            continue
        gathered = {_peer_name(p): data for p, data in result.items()}
        problems = check_group(gathered, job=job, epoch=epoch, peers=peers)
        if problems:
            # A wrong group already mixed our buffer with strangers' gradients; never use it.
            raise VolunteerError(f"step {epoch}: averaging group rejected: {'; '.join(problems)}")
        with torch.no_grad(), averager.get_tensors() as tensors:
            mine = fingerprint(tensors, epoch)
        members = [(float(d["weight"]), [tuple(x) for x in d["fingerprint"]]) for d in gathered.values()]
        problems = check_average(mine, members)
        if problems:
            raise VolunteerError(
                f"step {epoch}: the all-reduce did not produce the group's average "
                f"(a part failed?): {'; '.join(problems[:3])}"
            )
        reachable = tuple(sorted(p for p, d in gathered.items() if not d.get("client")))
        return Averaged(tuple(sorted(gathered)), reachable, attempts, time.monotonic() - began)
    raise VolunteerError(
        f"step {epoch}: could not average with {peers} learners in {deadline_s:g}s "
        f"({attempts} attempts; last: {last or 'none'}); refusing to step alone"
    )
