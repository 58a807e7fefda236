"""Pure: words quoted from someone else (the API server, the kubelet, a worker's termination message)
fitted into a status message. Each source is cut where its words matter least: the API server's and the
kubelet's messages say what went wrong first, so their end goes; a termination message that fell back to
the log is the log's tail, whose last lines say why the worker ended, so its start goes."""

from __future__ import annotations

SHORT = 300
"""A kubelet's or a worker's words: one line of a condition among others."""
LONG = 600
"""An API server's refusal, which can list several violated rules."""


def head(said: str, limit: int = SHORT) -> str:
    """`said` on one line, its first `limit` characters (an ellipsis says where it was cut)."""
    said = " ".join(said.split())
    return said if len(said) <= limit else said[: limit - 1] + "…"


def tail(said: str, limit: int = SHORT) -> str:
    """`said`'s last `limit` characters, line breaks kept (an ellipsis says where it was cut)."""
    return said if len(said) <= limit else "…" + said[-(limit - 1) :]
