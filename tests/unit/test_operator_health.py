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
        # Passes keep failing (each finishes, so the stall rule alone would not see it).
        (
            {"api_error": None, "jobs": 2, "since_last_pass": 1.0, "failing_for": 121.0},
            "every reconcile pass",
        ),
        ({"api_error": None, "jobs": 2, "since_last_pass": 1.0, "failing_for": 30.0}, None),  # not yet
        ({"api_error": None, "jobs": 0, "since_last_pass": 1.0, "failing_for": 500.0}, None),  # no job
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


async def test_passes_that_keep_failing_fail_liveness_but_not_readiness() -> None:
    now = [1000.0]

    async def probe() -> None:
        return None

    health = Health(
        api_probe=probe,
        jobs=lambda: 1,
        last_pass=lambda: now[0] - 1,
        failing_since=lambda: (800.0, "ApiError: HTTP 403 Forbidden: pods is forbidden"),
        stall_after=120,
        clock=lambda: now[0],
    )
    status, body, _ = await health.route()
    assert status == 503 and b"every reconcile pass has failed for 200s" in body
    assert b"403 Forbidden" in body
    assert await health.ready_route() == (200, b"ok\n", "text/plain")


async def test_a_watch_that_cannot_open_fails_both() -> None:
    async def probe() -> None:
        raise RuntimeError("GET apis/dverl.io/v1alpha1/rlhfjobs: HTTP 403 Forbidden: cannot watch")

    health = Health(api_probe=probe, jobs=lambda: 0, last_pass=lambda: None, stall_after=120)
    for route in (health.route, health.ready_route):
        status, body, _ = await route()
        assert status == 503 and b"watch RLHFJobs" in body and b"cannot watch" in body
