"""A volunteer's record in the job's DHT key: who it is, what it serves, how fast, which policy it holds.

Records are sub-keys (the peer id) of one key per job, each with an expiry; a heartbeat re-stores the
record before it lapses, so a volunteer that vanishes drops out of discovery within one TTL. The DHT is
writable by anyone: a record is a *claim*. The coordinator dispatches only to peers that proved their
join token to it over an authenticated stream (see discovery.py); the record says how to weight them.

An admitted volunteer also stores its record under a key only it and the coordinator can name
(`admitted_key`: derived from its join token), and a token-checked coordinator reads those keys alone,
one per peer it admitted: a flood of validly self-signed records from fresh identities under the job's
key costs the coordinator nothing, and cannot hide an honest volunteer from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from decentralized_verl.runtime import device
from decentralized_verl.runtime.lifecycle import cancel_and_wait

log = logging.getLogger(__name__)

ROLES = ("rollout", "reward", "reference", "critic", "learner", "actor", "span", "front", "coordinator")
"""`span`: a volunteer serving layers; `front`: a job's own rollout worker whose spans volunteers serve;
`coordinator`: the job's learner, announcing where it listens to volunteers that cannot route to it."""
DEFAULT_TTL = 30.0


def job_key(job: str) -> str:
    return f"dverl/{job}/volunteers"


@dataclass(frozen=True)
class VolunteerRecord:
    peer_id: str
    role: str
    hardware: str
    tokens_per_second: float
    policy_version: int
    expires_at: float
    started_at: float = 0.0
    model: str = ""
    """Open quick-start workers: the local model folder they serve (a trainer without --model uses it)."""
    maddrs: tuple[str, ...] = ()
    """Where the peer listens (no /p2p/ suffix): the trainer dials these before its first stream, since
    libp2p's own routing may not know a peer that only talked to the bootstrap."""
    temperature: float = 1.0
    """Reference volunteers: the sampling temperature their log-probs are computed at."""

    def to_value(self) -> dict:
        value = asdict(self)
        value["maddrs"] = list(self.maddrs)
        return value

    @classmethod
    def from_value(cls, peer_id: str, value: object) -> VolunteerRecord:
        """Parse a record read from the DHT; raises ValueError naming the bad field."""
        if not isinstance(value, dict):
            raise ValueError(f"record of {peer_id}: not a mapping ({type(value).__name__})")
        try:
            record = cls(
                peer_id=str(value["peer_id"]),
                role=str(value["role"]),
                hardware=str(value["hardware"])[:200],
                tokens_per_second=float(value["tokens_per_second"]),
                policy_version=int(value["policy_version"]),
                expires_at=float(value["expires_at"]),
                started_at=float(value.get("started_at", 0.0)),
                model=str(value.get("model", ""))[:1000],
                maddrs=tuple(str(a)[:200] for a in list(value.get("maddrs", ()))[:16]),
                temperature=float(value.get("temperature", 1.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"record of {peer_id}: {type(exc).__name__}: {exc}") from None
        if record.peer_id != peer_id:
            raise ValueError(f"record of {peer_id}: names another peer ({record.peer_id})")
        if record.role not in ROLES:
            raise ValueError(f"record of {peer_id}: unknown role {record.role!r}")
        if not math.isfinite(record.tokens_per_second) or record.tokens_per_second < 0:
            raise ValueError(f"record of {peer_id}: tokens_per_second {record.tokens_per_second}")
        if not math.isfinite(record.temperature) or record.temperature < 0:
            raise ValueError(f"record of {peer_id}: temperature {record.temperature}")
        return record


def hardware_summary() -> str:
    """`cuda:NVIDIA H100 80GB x1` or `cpu:16 cores`: what the dispatcher's prior is read from."""
    if device.gpu_count():
        return device.gpu_name()
    return f"cpu:{os.cpu_count()} cores"


def admitted_key(job: str, token: str) -> str:
    """Where an admitted volunteer's record is also kept: named by a hash of its join token, which only
    the volunteer and the coordinator hold, so no stranger can flood, overwrite or evict it."""
    return f"dverl/{job}/admitted/{hashlib.sha256(token.encode()).hexdigest()[:40]}"


def front_key(job: str, job_key_pem: bytes, peer_id: str) -> str:
    """Where one of the job's own span fronts keeps its record too: named from the job's private TLS key,
    which only the job's processes hold, so the coordinator reads it without reading the job's key."""
    return admitted_key(job, hashlib.sha256(job_key_pem + peer_id.encode()).hexdigest())


async def store_record(dht, job: str, record: VolunteerRecord, private_key: str | None = None) -> bool:
    """Store under the job's key (signed by this peer's identity, `signed_records`) and, for an admitted
    volunteer, under its `admitted_key` too."""
    keys = [job_key(job), *([private_key] if private_key else [])]
    futures = [
        dht.store(key, record.to_value(), record.expires_at, subkey=record.peer_id, return_future=True)
        for key in keys
    ]
    return all([bool(await future) for future in futures])


async def read_admitted(
    dht, keys: dict[str, str], *, now: float | None = None
) -> tuple[list[VolunteerRecord], list[str]]:
    """The live records of the peers in `keys` (peer id -> its `admitted_key`), each read from its own
    key: one read per admitted peer, whatever else the job's key holds. A record under a peer's key
    that names another peer is a problem, not a record."""
    current = time.time() if now is None else now
    found = await asyncio.gather(*(dht.get(key, latest=True, return_future=True) for key in keys.values()))
    records: list[VolunteerRecord] = []
    problems: list[str] = []
    for peer_id, entry in zip(keys, found, strict=True):
        if entry is None or not isinstance(entry.value, dict) or peer_id not in entry.value:
            continue
        try:
            record = VolunteerRecord.from_value(peer_id, entry.value[peer_id].value)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if record.expires_at > current:
            records.append(record)
    return records, problems


async def read_records(dht, job: str, *, now: float | None = None) -> tuple[list[VolunteerRecord], list[str]]:
    """Live records under the job's key, and a line per malformed one (logged by the caller)."""
    found = await dht.get(job_key(job), latest=True, return_future=True)
    current = time.time() if now is None else now
    records: list[VolunteerRecord] = []
    problems: list[str] = []
    if found is None or not isinstance(found.value, dict):
        return records, problems
    for subkey, item in found.value.items():
        try:
            record = VolunteerRecord.from_value(str(subkey), item.value)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if record.expires_at > current:
            records.append(record)
    return records, problems


class Heartbeat:
    """Re-store a volunteer's record every `interval` seconds with a fresh expiry (interval < ttl)."""

    def __init__(
        self,
        dht,
        job: str,
        make_record: Callable[[float], VolunteerRecord],
        *,
        interval: float = 5.0,
        ttl: float = DEFAULT_TTL,
        private_key: str | None = None,
    ) -> None:
        if interval >= ttl:
            raise ValueError(f"heartbeat interval {interval:g}s must be shorter than the ttl {ttl:g}s")
        self.dht, self.job, self.make_record = dht, job, make_record
        self.interval, self.ttl = interval, ttl
        self.private_key = private_key
        """An admitted volunteer's `admitted_key`: its record is stored there too."""
        self.beats = 0
        self._task: asyncio.Task | None = None

    async def beat(self) -> VolunteerRecord:
        """Store a fresh record; give up waiting after one interval. A store reaches every DHT peer it
        can at once but only reports when the last replica answered, and one partitioned replica can
        hold that answer for longer than the record lives: waiting for it would let the record lapse."""
        record = self.make_record(time.time() + self.ttl)
        try:
            async with asyncio.timeout(self.interval):  # unlike wait_for, never drops a stop's cancellation
                stored = await store_record(self.dht, self.job, record, self.private_key)
        except TimeoutError:
            log.info(
                "a DHT replica is slow to confirm the announcement; beating again in %.0fs", self.interval
            )
            stored = True
        if not stored:
            log.warning("DHT did not accept the announcement (will retry in %.0fs)", self.interval)
        self.beats += 1
        return record

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:  # a transient DHT error must not kill the volunteer
                log.exception("heartbeat failed")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="volunteer-heartbeat")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
