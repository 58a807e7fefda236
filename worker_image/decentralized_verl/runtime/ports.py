"""Ports handed to workers before they start: chosen where the kernel never hands out ports on its own.

A port picked by binding port 0 and closing comes from the ephemeral range, which is exactly where every
other process's outgoing connections and port-0 listeners (a worker's bulk weight port, a DHT peer, a
test's gRPC server) land. Between the pick and the worker's bind, one of those can take it, and the worker
then fails to start, or, worse, a client reaches the wrong server. Ports below the ephemeral range are
only ever taken by someone asking for that number, so a random free one there stays free.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
_handed_out: set[tuple[str, int]] = set()
_lock = threading.Lock()


def ephemeral_floor(range_file: Path = RANGE_FILE) -> int:
    """The kernel's lowest ephemeral port (32768 where the range cannot be read)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None, tries: int = 200) -> int:
    """A port free on `host` now, below the ephemeral range, never the same one twice in this process.

    Falls back to a kernel-chosen port where the ephemeral range starts too low to leave room below it.
    """
    rng = rng or random.SystemRandom()
    floor = ephemeral_floor()
    if floor - LOWEST >= 1000:
        with _lock:
            for _ in range(tries):
                port = rng.randrange(LOWEST, floor)
                if (host, port) not in _handed_out and _bindable(host, port):
                    _handed_out.add((host, port))
                    return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
