"""Which open workers a quick-start trainer uses, found by their DHT announcements alone.

Actors and a critic are required (the critic for PPO); reward and reference volunteers are optional and
used only when they can be trusted to match: rewards from the first reward peer (for `reward_model`,
only one serving the same reward-model folder), reference log-probs only from a peer serving this
trainer's own model folder at its temperature. Anything else, or a call that fails, is computed by the
trainer itself (fallback.py; the trainer's clients are put together in `entrypoints.quickstart_scoring`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from decentralized_verl.errors import VolunteerError
from decentralized_verl.volunteers.announce import job_key, read_records


async def find_workers(dht, job: str, *, need_critic: bool, timeout: float, poll_s: float = 0.5):
    """(actor records, critic records) once at least one actor (and a critic, for PPO) is announced."""
    deadline = time.monotonic() + timeout
    while True:
        records, _ = await read_records(dht, job)
        actors = [r for r in records if r.role in ("actor", "rollout")]
        critics = sorted((r for r in records if r.role == "critic"), key=lambda r: r.started_at)
        if actors and (critics or not need_critic):
            return actors, critics
        if time.monotonic() >= deadline:
            missing = "actor" if not actors else "critic (PPO needs one)"
            raise VolunteerError(
                f"no {missing} announced under {job_key(job)} after {timeout:g}s; start "
                "`dverl-worker --initial-peers ... --model PATH --role actor|critic` first"
            )
        await asyncio.sleep(poll_s)


def _same_folder(a: str, b: str) -> bool:
    return bool(a) and bool(b) and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def pick_reward_peer(records, spec) -> tuple[Any | None, str]:
    """(the reward record to use or None, why) for the job's reward type."""
    peers = sorted((r for r in records if r.role == "reward"), key=lambda r: r.started_at)
    if not peers:
        return None, "no reward volunteer announced"
    if spec.data.reward_type == "reward_model":
        wanted = spec.data.reward_model.path if spec.data.reward_model else ""
        peers = [r for r in peers if _same_folder(r.model, wanted or "")]
        if not peers:
            return None, f"no reward volunteer serves the reward model {wanted}"
    return peers[0], f"reward volunteer {peers[0].peer_id}"


def pick_reference_peer(records, model_path: str, temperature: float) -> tuple[Any | None, str]:
    """(the reference record to use or None, why): it must serve this model folder at this temperature."""
    peers = sorted((r for r in records if r.role == "reference"), key=lambda r: r.started_at)
    if not peers:
        return None, "no reference volunteer announced"
    same = [r for r in peers if _same_folder(r.model, model_path)]
    if not same:
        return (
            None,
            f"reference volunteers serve other models ({', '.join(sorted({r.model for r in peers}))})",
        )
    matching = [r for r in same if abs(r.temperature - temperature) < 1e-9]
    if not matching:
        return (
            None,
            f"reference volunteers compute at temperature {same[0].temperature:g}, not {temperature:g}",
        )
    return matching[0], f"reference volunteer {matching[0].peer_id}"
