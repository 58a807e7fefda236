"""Connections to the addresses that were checked: each host a fetch talks to is resolved once, and every
connection to it goes to those addresses, by number, while TLS still checks the certificate against the
host's name (SNI) and the request still says `Host: name`.

Without this a redirect's target is resolved twice, once when `redirects` judges its addresses and again
when the connection is opened, and a DNS server that answers a public address first and a loopback one
second (rebinding) steers the fetcher to a service only the pod can reach, past the check.
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

Resolver = Callable[[str], list[str]]


class Pins:
    """Each host's addresses, resolved once for the life of one fetch (an address literal is itself)."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self._known: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def addresses(self, host: str) -> list[str]:
        key = host.lower()
        with self._lock:
            if key not in self._known:
                self._known[key] = list(self.resolver(key))
            return list(self._known[key])


def _connect(
    pins: Pins,
    address: tuple[str, int],
    timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,
    source_address: Any = None,
) -> socket.socket:
    """`socket.create_connection` to the pinned addresses of `address`'s host, in order."""
    host, port = address
    found = pins.addresses(host)
    if not found:
        raise OSError(f"{host} does not resolve")
    last: OSError | None = None
    for ip in found:
        try:
            return socket.create_connection((ip, port), timeout, source_address)
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


class PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, pins: Pins, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_connect, pins)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, pins: Pins, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_connect, pins)


class PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, pins: Pins) -> None:
        super().__init__()
        self.pins = pins

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(PinnedHTTPConnection, pins=self.pins), req)


class PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, pins: Pins) -> None:
        super().__init__()
        self.pins = pins

    def https_open(self, req: urllib.request.Request) -> Any:
        connection = functools.partial(PinnedHTTPSConnection, pins=self.pins)
        return self.do_open(connection, req, context=self._context)
