"""Cluster DNS on the node's bridge address, port 53: answers A queries from the zone the node keeps
(dns.zone), NXDOMAIN for other names, as CoreDNS does for `cluster.local`. gRPC's default resolver
(c-ares) reads resolv.conf and asks a server, never /etc/hosts, so the hosts file alone would not do.

`answer` is pure (one query in, one reply out); `serve` binds it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from collections.abc import Callable

TYPE_A = 1
CLASS_IN = 1
TTL = 1


def parse_question(query: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end offset of the question) of a DNS query; ValueError if malformed."""
    if len(query) < 12:
        raise ValueError("short DNS header")
    ident, flags, questions = struct.unpack("!HHH", query[:6])
    if questions != 1:
        raise ValueError("exactly one question expected")
    labels, at = [], 12
    while True:
        if at >= len(query):
            raise ValueError("name runs past the message")
        length = query[at]
        at += 1
        if length == 0:
            break
        if length & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(query[at : at + length].decode("ascii", "replace"))
        at += length
    if at + 4 > len(query):
        raise ValueError("question has no type")
    qtype, _ = struct.unpack("!HH", query[at : at + 4])
    return ident, flags, ".".join(labels).lower(), qtype, at + 4


def answer(query: bytes, lookup: Callable[[str], list[str] | None]) -> bytes | None:
    """The reply to one query: A records for a known name, an empty answer for its other types,
    NXDOMAIN for an unknown name; None for a message that is not a query."""
    try:
        ident, flags, name, qtype, end = parse_question(query)
    except ValueError:
        return None
    if flags & 0x8000:
        return None  # a response, not a query
    addresses = lookup(name)
    rcode = 0 if addresses is not None else 3
    records = [a for a in addresses or [] if qtype == TYPE_A]
    reply_flags = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode  # QR, AA, RD copied, RA
    header = struct.pack("!HHHHHH", ident, reply_flags, 1, len(records), 0, 0)
    body = query[12:end]
    for address in records:
        body += (
            struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4) + ipaddress.IPv4Address(address).packed
        )
    return header + body


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, lookup: Callable[[str], list[str] | None]) -> None:
        self.lookup = lookup
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = answer(data, self.lookup)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


async def serve(
    host: str, lookup: Callable[[str], list[str] | None], port: int = 53
) -> asyncio.DatagramTransport:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(lookup), local_addr=(host, port))
    return transport
