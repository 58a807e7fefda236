"""The userspace link between one host and the router: latency, jitter and loss for whole IP packets.

The kernels this runs on have no `netem`, so a host with a slow or lossy link is not plugged into the
bridge; instead it gets a TUN device (its `eth0`) and the router namespace another (`t<N>`), and this
process carries every packet between the two: each packet is dropped with probability `loss` or held
for half the round trip plus jitter, then written out in order. TCP above sees a real lossy, delayed
path (retransmissions, congestion windows), not a slowed socket. Bandwidth stays with the kernel: tc
`tbf` on the two TUN devices.

Run inside the router namespace (`ip netns exec ROUTER python netlab/link_relay.py ...`, by its path: it
imports nothing but the standard library); it enters the host's namespace only to create the host's
device. The devices belong to this process and vanish when it exits, so ending it (or its parent dying)
leaves nothing behind.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import os
import random
import signal
import struct
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
MAX_PACKET = 65536

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def open_tun(name: str) -> int:
    """A TUN device `name` (no packet-info header) in the calling thread's namespace; its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def enter_namespace(path: str) -> None:
    with open(path, "rb") as ns:
        if _libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")


class Direction:
    """Packets one way: a reader that drops or timestamps each, a writer that releases them on time.

    Departures never go backwards (a packet leaves no earlier than the one before it), so jitter
    spreads packets out without reordering them."""

    def __init__(self, src: int, dst: int, *, delay_s: float, jitter_s: float, loss: float, seed: int):
        self.src, self.dst = src, dst
        self.delay_s, self.jitter_s, self.loss = delay_s, jitter_s, loss
        self.rng = random.Random(seed)
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.last_departure = 0.0
        self.forwarded = 0
        self.dropped = 0

    def read_forever(self) -> None:
        while True:
            packet = os.read(self.src, MAX_PACKET)
            if self.loss and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            jitter = self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
            departure = max(self.last_departure, time.monotonic() + self.delay_s + jitter)
            self.last_departure = departure
            with self.ready:
                self.queue.append((departure, packet))
                self.ready.notify()

    def write_forever(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                departure, packet = self.queue.popleft()
            wait = departure - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(self.dst, packet)
                self.forwarded += 1
            except OSError:  # the device is down (a partition): the packet is lost, as on a cut wire
                self.dropped += 1

    def start(self, name: str) -> None:
        for target, role in ((self.read_forever, "read"), (self.write_forever, "write")):
            threading.Thread(target=target, name=f"{name}-{role}", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-netns", required=True, help="path of the host's namespace (/run/netns/NAME)")
    parser.add_argument("--host-dev", default="eth0")
    parser.add_argument("--router-dev", required=True)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the harness died: take the devices with us
    if os.getppid() == 1:
        return 1
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    router = open_tun(args.router_dev)
    enter_namespace(args.host_netns)
    host = open_tun(args.host_dev)
    if _libc.setns(home, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(back to the router)")
    delay, jitter = args.rtt_ms / 2000.0, args.jitter_ms / 1000.0
    up = Direction(host, router, delay_s=delay, jitter_s=jitter, loss=args.loss, seed=args.seed * 2 + 1)
    down = Direction(router, host, delay_s=delay, jitter_s=jitter, loss=args.loss, seed=args.seed * 2 + 2)
    up.start("up")
    down.start("down")
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
