"""Shared fixtures."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def collected_before_fork() -> Iterator[None]:
    """hivemind starts its DHT and averagers as forked processes. Garbage left by earlier tests (gRPC
    channels and servers, finished compute work) would otherwise be inherited and collected in the child,
    where destroying objects whose threads stayed in the parent can abort it; collect it here first."""
    gc.collect()
    yield
