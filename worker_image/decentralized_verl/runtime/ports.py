"""Ports handed to workers before they start: chosen where no one else hands out ports on their own.

A port picked by binding port 0 and closing comes from the ephemeral range, which is exactly where every
other process's outgoing connections and port-0 listeners (a worker's bulk weight port, a DHT peer, a
test's gRPC server) land. Between the pick and the worker's bind, one of those can take it, and the worker
then fails to start, or, worse, a client reaches the wrong server. Ports below the ephemeral range are
only ever taken by someone asking for that number, so a random free one there stays free, except where a
tool asks for numbers of its own: Ray, on whose nodes `dverl run --ray` starts workers, binds its client
server and its worker processes' ports in 10001-19999 by default and refuses a head port among them.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
CLAIMED: tuple[range, ...] = (
    range(6379, 6380),  # Ray's GCS (the head's default --port)
    range(8265, 8266),  # Ray's dashboard
    range(10001, 20000),  # Ray's client server (10001), its workers' ports (--min/--max-worker-port)
    range(52365, 52366),  # Ray's dashboard agent
)
"""Ports other tools take by number, by default, on the machines where workers run."""
_handed_out: set[tuple[str, int]] = set()
_lock = threading.Lock()


def ephemeral_floor(range_file: Path = RANGE_FILE) -> int:
    """The kernel's lowest ephemeral port (32768 where the range cannot be read)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def open_ranges(floor: int, claimed: tuple[range, ...] = CLAIMED) -> list[range]:
    """The ports from LOWEST up to `floor` that no range in `claimed` holds, in order."""
    spans = [range(LOWEST, floor)]
    for taken in claimed:
        cut = []
        for span in spans:
            below = range(span.start, min(span.stop, taken.start))
            above = range(max(span.start, taken.stop), span.stop)
            cut += [part for part in (below, above) if len(part)]
        spans = cut
    return spans


def nth_port(spans: list[range], index: int) -> int:
    """The `index`-th port of `spans` counted across them (0 <= index < their total length)."""
    for span in spans:
        if index < len(span):
            return span[index]
        index -= len(span)
    raise IndexError("index beyond the ranges' ports")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None, tries: int = 200) -> int:
    """A port free on `host` now, below the ephemeral range and outside every `CLAIMED` range, never the
    same one twice in this process.

    Falls back to a kernel-chosen port where the ephemeral range starts too low to leave room below it.
    """
    rng = rng or random.SystemRandom()
    spans = open_ranges(ephemeral_floor())
    total = sum(len(span) for span in spans)
    if total >= 1000:
        with _lock:
            for _ in range(tries):
                port = nth_port(spans, rng.randrange(total))
                if (host, port) not in _handed_out and _bindable(host, port):
                    _handed_out.add((host, port))
                    return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
