"""Ports handed to workers come from below the kernel's ephemeral range and outside the ranges Ray takes by
number, so no port-0 listener, outgoing connection or Ray process can take one between the pick and the
worker's bind, and a Ray head accepts one as its port.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.runtime.ports import (
    ephemeral_floor,
    nth_port,
    open_ranges,
)


def test_the_open_ranges_leave_out_every_claimed_range() -> None:
    assert open_ranges(32768) == [range(10000, 10001), range(20000, 32768)]
    assert open_ranges(15000) == [range(10000, 10001)]  # room for one: free_port asks the kernel instead
    assert open_ranges(60000) == [range(10000, 10001), range(20000, 52365), range(52366, 60000)]
    spans = open_ranges(32768)
    assert [nth_port(spans, i) for i in (0, 1, 2)] == [10000, 20000, 20001]
    assert nth_port(spans, sum(len(s) for s in spans) - 1) == 32767


def test_the_floor_falls_back_when_the_range_cannot_be_read(tmp_path: Path) -> None:
    assert ephemeral_floor(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_floor(tmp_path / "range") == 40000
