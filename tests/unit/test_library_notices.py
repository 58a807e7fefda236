"""The library notices dropped at the entry are dropped, and nothing else from those loggers is."""

from __future__ import annotations

import logging

import pytest

from decentralized_verl.runtime.library_notices import DROPPED, quiet_library_notices


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@pytest.mark.parametrize(("name", "prefix"), DROPPED)
def test_the_notice_is_dropped_and_other_warnings_kept(name: str, prefix: str) -> None:
    quiet_library_notices()
    quiet_library_notices()  # twice: one filter
    logger = logging.getLogger(name)
    assert len(logger.filters) == len([p for n, p in DROPPED if n == name])
    keep = _Keep()
    logger.addHandler(keep)
    try:
        logger.warning(prefix + ": %s. Please make sure ...", "No module named 'kernels'")
        logger.warning("a 4-bit layer could not be repacked")
    finally:
        logger.removeHandler(keep)
    assert keep.seen == ["a 4-bit layer could not be repacked"]
