"""Which redirects the source fetcher follows, and what it carries along.

A source's server is trusted to serve the bytes the digest checks, not to steer the fetcher: a redirect
could turn an https download into plain http, point the fetcher at a service only the pod can reach
(loopback, the cloud's metadata address, the cluster's private network), or collect the Hub token that
was meant for the source's own origin. So a redirect within the same origin (scheme, host, port) is
followed as it is; one to another origin is followed only over https and only to public addresses (or to
networks the deployment names in `FETCH_PRIVATE_REDIRECTS`, e.g. an in-cluster mirror), and never with
the `Authorization` header.

A host is resolved once per fetch (`pinned.Pins`): the addresses judged here are the ones the connection
goes to (`pinned`), so a DNS answer that changes in between (rebinding) changes nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from decentralized_verl.errors import DverlError
from decentralized_verl.sources.pinned import Pins, Resolver

PRIVATE_REDIRECTS_ENV = "FETCH_PRIVATE_REDIRECTS"
"""Comma-separated networks (CIDR) a redirect may lead to although they are not public."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RedirectRefused(DverlError):
    """A redirect the fetcher will not follow; the message names both URLs and the reason."""


def networks_from_env(env: Mapping[str, str]) -> tuple[Network, ...]:
    text = env.get(PRIVATE_REDIRECTS_ENV, "")
    try:
        return tuple(ipaddress.ip_network(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise RedirectRefused(f"{PRIVATE_REDIRECTS_ENV}: not a list of networks ({exc})") from None


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    default = {"https": 443, "http": 80}.get(scheme)
    return scheme, (parts.hostname or "").lower(), parts.port or default


def resolve(host: str) -> list[str]:
    """Every address `host` resolves to (an address literal: itself)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def redirect_problem(
    old: str, new: str, addresses: Iterable[str], allowed: tuple[Network, ...] = ()
) -> str | None:
    """Why the redirect from `old` to `new` is refused, or None when it may be followed. Pure."""
    if origin(old) == origin(new):
        return None
    scheme = urlsplit(new).scheme.lower()
    if scheme != "https":
        return f"another origin over {scheme or 'no scheme'}:// (only https:// is followed there)"
    found = list(addresses)
    if not found:
        return f"{urlsplit(new).hostname!r} does not resolve"
    for text in found:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if address.is_global or any(address in network for network in allowed):
            continue
        kind = (
            "loopback"
            if address.is_loopback
            else "link-local"
            if address.is_link_local
            else "private"
            if address.is_private
            else "not public"
        )
        return f"it leads to {text}, a {kind} address"
    return None


class GuardedRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling with `redirect_problem` asked first and credentials left behind."""

    def __init__(
        self, allowed: tuple[Network, ...] = (), resolver: Resolver = resolve, pins: Pins | None = None
    ) -> None:
        self.allowed = allowed
        self.pins = pins if pins is not None else Pins(resolver)

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        host = urlsplit(newurl).hostname or ""
        same = origin(req.full_url) == origin(newurl)
        problem = redirect_problem(
            req.full_url, newurl, [] if same else self.pins.addresses(host), self.allowed
        )
        if problem is not None:
            raise RedirectRefused(f"{req.full_url}: refusing the redirect to {newurl}: {problem}")
        follow = super().redirect_request(req, fp, code, msg, headers, newurl)
        if follow is not None and not same:
            follow.remove_header("Authorization")
        return follow
