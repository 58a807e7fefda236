"""In-cluster rollout workers that come and go while the job runs.

When replicas change, the operator adds or deletes only the affected pods and rewrites `workers.yaml` in the
job's ConfigMap; the kubelet refreshes the mounted copy in every pod within a minute or so. The learner keeps
running (a restart would cost a step and a checkpoint reload), so it re-reads that file and brings its
dispatcher in line: new workers join once their Health says ready (they pull the current weights on their
first request), removed ones leave. Volunteers join the same dispatcher through the DHT; this is the trusted,
in-cluster half of the same idea.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from decentralized_verl.core.interfaces import RolloutClient
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.planning.devices import GPU_PRIORS
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec import safe_yaml
from decentralized_verl.transport import clients

if TYPE_CHECKING:
    from decentralized_verl.orchestration.assemble import Attachment, Closer, LoopContext

log = logging.getLogger(__name__)

WORKERS_FILE = "workers.yaml"


class WorkersFileError(ValueError):
    """The workers file is not what the operator writes; the message names the entry and field."""


@dataclass(frozen=True)
class Member:
    worker_id: str
    address: str
    pool: str = ""
    gpu_type: str = ""

    @property
    def prior(self) -> float:
        """Throughput guess from the pool's GPU type until the dispatcher has measured the worker."""
        return GPU_PRIORS.get(self.gpu_type or self.pool, 1.0)


def rollout_members(text: str, source: str = WORKERS_FILE) -> dict[str, Member]:
    """Parse the operator's `workers.yaml` (pod name -> role, index, address, pool); keep the rollout role."""
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as exc:
        raise WorkersFileError(f"{source}: not YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WorkersFileError(f"{source}: expected a mapping of worker name -> entry")
    members: dict[str, Member] = {}
    for name, entry in data.items():
        where = f"{source}: {name}"
        if not isinstance(entry, dict):
            raise WorkersFileError(f"{where}: expected a mapping with role and address")
        role = entry.get("role")
        if not isinstance(role, str):
            raise WorkersFileError(f"{where}.role: missing or not a string")
        if role != "rollout":
            continue
        address = entry.get("address")
        if not isinstance(address, str) or ":" not in address:
            raise WorkersFileError(f"{where}.address: expected host:port (got {address!r})")
        extra = {}
        for key, attr in (("pool", "pool"), ("gpuType", "gpu_type")):
            value = entry.get(key, "") or ""
            if not isinstance(value, str):
                raise WorkersFileError(f"{where}.{key}: expected a string (got {value!r})")
            extra[attr] = value
        members[str(name)] = Member(str(name), address, **extra)
    return members


@dataclass(frozen=True)
class Change:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    """Listed in the file but not answering Health yet; retried on the next refresh."""


Connect = Callable[[Member], Awaitable[RolloutClient | None]]
"""A client for a member once it is ready, or None while it is not."""


@dataclass
class WorkersFileWatcher:
    """Keeps a Dispatcher's in-cluster rollout workers equal to the mounted workers file."""

    path: Path
    dispatcher: Dispatcher
    connect: Connect
    known: dict[str, Member] = field(default_factory=dict)
    """Members the dispatcher already has (the ones the learner connected at start)."""
    interval_s: float = 5.0
    on_change: Callable[[Member, bool], None] | None = None
    """Told (member, joined) after each join or leave, e.g. to add the worker to the weight push route."""
    _last_text: str | None = None
    _task: asyncio.Task | None = None

    async def refresh(self) -> Change:
        """One pass: read the file, remove workers no longer listed, add listed ones that are ready.

        A file that cannot be read or parsed changes nothing: a half-written or bad file must never take
        workers away from a running job.
        """
        try:
            text = self.path.read_text()
        except OSError as exc:
            log.warning("workers file %s unreadable, keeping %d workers: %s", self.path, len(self.known), exc)
            return Change()
        try:
            desired = rollout_members(text, str(self.path))
        except WorkersFileError as exc:
            if text != self._last_text:
                log.error("ignoring bad workers file: %s", exc)
            self._last_text = text
            return Change()
        self._last_text = text
        removed = tuple(sorted(set(self.known) - set(desired)))
        for worker_id in removed:
            client = self.dispatcher.clients.get(worker_id)
            self.dispatcher.remove(worker_id)
            gone = self.known.pop(worker_id)
            if self.on_change is not None:
                self.on_change(gone, False)
            if client is not None:
                await client.close()  # a dispatch still on it fails over to the other workers
        added: list[str] = []
        waiting: list[str] = []
        for worker_id, member in desired.items():
            if worker_id in self.known and self.known[worker_id].address == member.address:
                continue
            client = await self.connect(member)
            if client is None:
                waiting.append(worker_id)
                continue
            self.dispatcher.add(client, prior=member.prior)
            if worker_id in self.known and self.on_change is not None:
                self.on_change(self.known[worker_id], False)  # it moved: the old address leaves the route
            self.known[worker_id] = member
            if self.on_change is not None:
                self.on_change(member, True)
            added.append(worker_id)
        change = Change(tuple(added), removed, tuple(waiting))
        if change.added or change.removed:
            log.info("rollout workers changed: +%s -%s (now %d)", added, list(removed), len(self.known))
        return change

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:  # a watcher bug must not end training; log and keep the workers we have
                log.exception("workers file refresh failed")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="workers-file-watcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def workers_file_path(settings: WorkerSettings) -> Path | None:
    """DVERL_WORKERS_FILE, else `workers.yaml` beside the mounted job config when the operator wrote one."""
    if settings.workers_file:
        return Path(settings.workers_file)
    if settings.config:
        candidate = Path(settings.config).parent / WORKERS_FILE
        if candidate.exists():
            return candidate
    return None


async def connect_when_ready(
    member: Member, timeout_s: float = 2.0, *, allow_newer: bool = False
) -> RolloutClient | None:
    """The learner's `Connect`: a gRPC rollout client once the worker's Health answers ready."""
    try:
        await clients.wait_ready(member.address, timeout=timeout_s)
    except TimeoutError as exc:
        log.info("%s not ready yet: %s", member.worker_id, exc)
        return None
    return clients.GrpcRolloutClient(member.address, worker_id=member.worker_id, allow_newer=allow_newer)


def start_watching(
    job: str,
    dispatcher: Dispatcher,
    settings: WorkerSettings,
    *,
    allow_newer: bool = False,
    weights: Any | None = None,
) -> WorkersFileWatcher | None:
    """Watch the mounted workers file, if there is one. The rollout workers the plan listed (worker i is the
    pod `<job>-rollout-<i>`) are already connected; `weights` (a `WeightFanout`) gets joining workers
    added to its push route and leaving ones removed."""
    path = workers_file_path(settings)
    if path is None:
        return None
    known = {
        f"{job}-rollout-{i}": Member(f"{job}-rollout-{i}", a) for i, a in enumerate(settings.rollout_addrs)
    }

    async def connect(member: Member) -> RolloutClient | None:
        return await connect_when_ready(member, allow_newer=allow_newer)

    def on_change(member: Member, joined: bool) -> None:
        if weights is not None:
            (weights.add_receiver if joined else weights.remove_receiver)(member.address)

    watcher = WorkersFileWatcher(
        path, dispatcher, connect, known=known, interval_s=settings.workers_poll_s, on_change=on_change
    )
    watcher.start()
    log.info("watching %s for rollout workers added or removed by scaling", path)
    return watcher


def follow_scaling(settings: WorkerSettings) -> Attachment:
    """Loop attachment: in a cluster, rollout workers added or removed by scaling join or leave dispatch
    (the workers file and poll interval from `settings`)."""

    async def attach(context: LoopContext) -> Closer | None:
        if not context.roles.remote_rollout:
            return None
        watcher = start_watching(
            context.job,
            context.dispatcher,
            settings,
            allow_newer=context.spec.training.max_staleness > 0,
            weights=context.roles.weights,
        )
        return watcher.close if watcher is not None else None

    return attach
