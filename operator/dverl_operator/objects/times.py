"""Pure: times as Kubernetes writes them (RFC 3339 in UTC, whole seconds)."""

from __future__ import annotations

import datetime


def timestamp(now: float) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch from an RFC 3339 UTC time as Kubernetes writes it; None when absent."""
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None
