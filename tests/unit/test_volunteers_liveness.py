"""Discovery under partitions: a DHT read that misses a record, or a heartbeat that could not land, does not
drop a volunteer; its record's expiry does, unless it answered work just now."""

from __future__ import annotations

import dataclasses
import time

from decentralized_verl.volunteers.announce import VolunteerRecord
from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub


class Dispatcher:
    def __init__(self) -> None:
        self.workers: dict[str, object] = {}

    def add(self, client, prior: float = 1.0) -> None:
        self.workers[client.worker_id] = client

    def remove(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)


def record(peer: str, expires_at: float) -> VolunteerRecord:
    return VolunteerRecord(peer, "rollout", "cpu:2 cores", 10.0, 0, expires_at)


def hub() -> tuple[VolunteerHub, Dispatcher]:
    dispatcher = Dispatcher()
    return VolunteerHub(HubConfig(job="j", secret=b"s" * 32, open=True), dispatcher), dispatcher


def test_a_read_that_misses_a_live_record_keeps_the_volunteer() -> None:
    h, dispatcher = hub()
    now = time.time()
    h.apply_records([record("a", now + 20), record("b", now + 20)], now=now)
    assert sorted(h.clients) == ["a", "b"] and len(dispatcher.workers) == 2
    h.apply_records([record("a", now + 25)], now=now + 5)  # b's record not seen this time: still live
    assert sorted(h.clients) == ["a", "b"]
    h.apply_records([record("a", now + 30)], now=now + 21)  # b's last record has lapsed: b is gone
    assert sorted(h.clients) == ["a"] and [e.kind for e in h.events].count("Removed") == 1


def test_a_volunteer_that_just_answered_outlives_its_record() -> None:
    h, _ = hub()
    now = time.time()
    h.apply_records([record("a", now + 20)], now=now)
    h.clients["a"].last_answer = now + 25  # answered work after its last heartbeat could land
    h.apply_records([], now=now + 30)
    assert "a" in h.clients  # 5 s since its answer
    h.apply_records([], now=now + 25 + h.config.answer_keeps_s + 1)
    assert "a" not in h.clients


def test_an_older_record_never_replaces_a_newer_one() -> None:
    h, _ = hub()
    now = time.time()
    h.apply_records([record("a", now + 30)], now=now)
    h.apply_records([record("a", now + 10)], now=now + 1)  # a stale replica answered this read
    assert [r.expires_at for r in h.remembered([], now + 15)] == [now + 30]
    assert "a" in h.clients


def test_a_volunteer_still_pulling_its_first_weights_is_kept_but_given_no_work() -> None:
    """A joined volunteer announces itself with version -1 while its first full bundle arrives (minutes on
    a slow link): it keeps its admission past `release_after_s` but gets work only once it holds weights."""
    from decentralized_verl.volunteers.discovery import PeerState

    dispatcher = Dispatcher()
    h = VolunteerHub(HubConfig(job="j", secret=b"s" * 32), dispatcher)
    now = time.time()
    h.peers["a"] = PeerState(now, "rollout")  # admitted by its join
    loading = VolunteerRecord("a", "rollout", "cpu:2 cores", 0.0, -1, now + 20)
    for t in range(0, 150, 10):  # longer than release_after_s, heartbeating all along
        h.apply_records([dataclasses.replace(loading, expires_at=now + t + 20)], now=now + t)
    assert "a" in h.peers and not h.clients and not dispatcher.workers
    h.apply_records([record("a", now + 170)], now=now + 150)  # its weights arrived: version 0
    assert "a" in h.clients and len(dispatcher.workers) == 1
    # Without heartbeats while loading it would have been released after release_after_s.
    h2 = VolunteerHub(HubConfig(job="j", secret=b"s" * 32), Dispatcher())
    h2.peers["b"] = PeerState(now, "rollout")
    h2.apply_records([], now=now + h2.config.release_after_s + 1)
    assert "b" not in h2.peers
