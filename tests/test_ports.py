"""Ports handed to workers come from below the kernel's ephemeral range, so no port-0 listener or outgoing
connection elsewhere can take one between the pick and the worker's bind."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from decentralized_verl.runtime.ports import LOWEST, ephemeral_floor, free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    floor = ephemeral_floor()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    if floor - LOWEST >= 1000:
        assert all(LOWEST <= p < floor for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # still free to the worker that was handed it


def test_a_port_in_use_is_skipped() -> None:
    floor = ephemeral_floor()
    if floor - LOWEST < 1000:
        return
    first = random.Random(1234).randrange(LOWEST, floor)  # what the same seed would pick first
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert free_port(rng=random.Random(1234)) != first


def test_the_floor_falls_back_when_the_range_cannot_be_read(tmp_path: Path) -> None:
    assert ephemeral_floor(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_floor(tmp_path / "range") == 40000
