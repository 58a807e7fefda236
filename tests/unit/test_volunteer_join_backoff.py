"""A volunteer whose coordinator does not answer retries with doubling pauses up to a bound and gives up
after its join timeout, saying that a volunteer joins a running job, instead of trying once a second
forever. The clock and the dial are the test's: the schedule is what is checked."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from decentralized_verl.entrypoints import volunteer
from decentralized_verl.errors import PeerUnavailable


def test_join_retries_back_off_to_a_bound_then_give_up(monkeypatch, caplog) -> None:
    clock = {"now": 0.0}
    pauses: list[float] = []

    async def unreachable(*_args, **_kwargs):
        clock["now"] += 0.5  # each try takes a moment
        raise ConnectionError("no route to peer")

    async def pause(seconds: float) -> None:
        pauses.append(seconds)
        clock["now"] += seconds

    monkeypatch.setattr(volunteer.wire, "join", unreachable)
    monkeypatch.setattr(volunteer.asyncio, "sleep", pause)
    monkeypatch.setattr(volunteer.time, "monotonic", lambda: clock["now"])
    request = SimpleNamespace(job="voljob")
    with caplog.at_level(logging.INFO, logger=volunteer.log.name), pytest.raises(PeerUnavailable) as gave_up:
        asyncio.run(volunteer._join_with_retry(None, "12D3KooWcoordinator", request, timeout=300.0))
    assert pauses[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0] and max(pauses) == 30.0
    assert clock["now"] <= 300.0 + 0.5  # gave up at the timeout, not after
    said = str(gave_up.value)
    assert "12D3KooWcoordinator of job 'voljob' in 300s" in said and "a volunteer joins a running job" in said
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not reachable" in warnings[0].getMessage()  # said once, then at INFO
