"""How many cores a process may compute on, and torch's thread pools sized to match.

torch sizes its pools from the machine's cores. In a pod that is the node's count, not the pod's CPU
limit, so a 4-CPU pod on a 64-core node runs 64 threads on 4 cores' worth of quota and is throttled
hard; on one machine, `dverl run`'s workers would each start a full-width pool on the same cores. Every
worker therefore takes the smallest of: the cores it may run on (affinity), its cgroup CPU quota, and
`DVERL_CPUS` (what `dverl run` gives it out of the machine's cores, see `share_cores`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from decentralized_verl.runtime import compute_thread, thread_governor
from decentralized_verl.runtime.heap import keep_freed_memory

if TYPE_CHECKING:
    from decentralized_verl.settings import WorkerSettings

CGROUP_ROOT = Path("/sys/fs/cgroup")
COMPUTE_ROLES = ("learner", "rollout", "reference", "critic")
"""Roles whose work is torch compute; reward scoring runs Python checks or sandboxes, the DHT nothing."""


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD") -> CPUs, None when unlimited or unreadable."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` -> CPUs, None when unlimited (-1)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup (v2, then v1), None when there is none."""
    try:
        return parse_cpu_max((root / "cpu.max").read_text())
    except OSError:
        pass
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        try:
            return parse_cfs(
                (folder / "cpu.cfs_quota_us").read_text(), (folder / "cpu.cfs_period_us").read_text()
            )
        except OSError:
            continue
    return None


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_cpus(given: float | None = None, *, root: Path = CGROUP_ROOT) -> int:
    """Cores this process should compute on: min(affinity, cgroup quota rounded down, `given`), >= 1.
    `given` is the cores it was handed (`WorkerSettings.cpus`, DVERL_CPUS)."""
    limits: list[float] = [affinity_cpus()]
    quota = cgroup_cpus(root)
    if quota is not None:
        limits.append(quota)
    if given is not None:
        limits.append(given)
    return max(1, math.floor(min(limits)))


def configure_torch(threads: int) -> None:
    """Size torch's intra-op pool (and OpenMP/MKL for libraries that read the variables) to `threads`.

    The inter-op pool can be sized only before torch's first parallel work, so a failure there is ignored.
    """
    import torch  # noqa: PLC0415 light: torch; `dverl run`'s supervisor shares cores with this module

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(max(1, min(threads, 4)))


def share_cores(cores: int, workers: Sequence[tuple[str, str]], *, overlapped: bool) -> dict[str, int]:
    """Cores for each local process of one machine (name -> cores), from (name, role) pairs.

    Processes compute at the same time within a phase: rollout, reference and critic workers during
    generation and scoring, the learners during the update. On-policy (`overlapped` False) the phases
    alternate, so each phase's processes split every core; with asynchronous rollouts the learner
    computes while rollouts do, so all of them split the cores. Others (reward, DHT) get one core.
    """
    serving = [name for name, role in workers if role in COMPUTE_ROLES and role != "learner"]
    learners = [name for name, role in workers if role == "learner"]
    out = {name: 1 for name, _ in workers}
    phases = [serving + learners] if overlapped else [serving, learners]
    for phase in phases:
        for name in phase:
            out[name] = max(1, cores // len(phase))
    return out


def configure_from_environment(settings: WorkerSettings) -> int:
    """Size torch's pools for this process, let the compute thread shrink them while other programs take
    cores (`thread_governor`), and keep freed tensor memory for reuse (`heap`); computing entry points call
    this first, before any worker thread starts. Returns the thread count."""
    threads = available_cpus(settings.cpus)
    configure_torch(threads)
    keep_freed_memory()
    compute_thread.govern(None if settings.fixed_threads else thread_governor.for_this_process(threads))
    return threads
