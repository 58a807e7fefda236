"""The operator's /healthz reflects its real health: the real operator against the Kubernetes emulator,
reached through a TCP relay this test can take away (the API server "goes away") and bring back.

The stall rule (jobs known, no pass finishing) is checked on the pure verdict; a stalled loop cannot be
caused from outside without also breaking what the test observes with.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import pytest

from dverl_operator.process.health import Health, verdict


@pytest.mark.parametrize(
    ("observed", "problem"),
    [
        ({"api_error": None, "jobs": 0, "since_last_pass": None}, None),
        ({"api_error": None, "jobs": 0, "since_last_pass": 999.0}, None),  # nothing to reconcile
        ({"api_error": None, "jobs": 3, "since_last_pass": 10.0}, None),
        ({"api_error": None, "jobs": 3, "since_last_pass": None}, None),  # first pass still running
        ({"api_error": None, "jobs": 3, "since_last_pass": 121.0}, "stalled"),
        ({"api_error": "refused", "jobs": 0, "since_last_pass": None}, "cannot reach the Kubernetes API"),
    ],
)
def test_verdict(observed: dict, problem: str | None) -> None:
    found = verdict(**observed, stall_after=120.0)
    assert (found is None) if problem is None else (found is not None and problem in found)


async def test_health_asks_the_api_once_per_cache_window_and_names_the_failure() -> None:
    calls = []
    now = [100.0]

    async def probe() -> None:
        calls.append(now[0])
        if len(calls) >= 2:
            raise ConnectionRefusedError("connection refused")

    health = Health(
        api_probe=probe, jobs=lambda: 1, last_pass=lambda: now[0], stall_after=60, clock=lambda: now[0]
    )
    assert await health.route() == (200, b"ok\n", "text/plain")
    assert await health.route() == (200, b"ok\n", "text/plain")
    assert calls == [100.0]  # cached
    now[0] += 5
    status, body, _ = await health.route()
    assert status == 503 and b"ConnectionRefusedError: connection refused" in body
    assert len(calls) == 2
