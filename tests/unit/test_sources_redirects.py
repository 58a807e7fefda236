"""The fetcher's redirect rule, pure: what it follows, what it refuses and why, and that the Hub token is
left behind at another origin. The live attacks (a real HTTPS server redirecting) are in
tests/integration/test_sources_fetch.py."""

from __future__ import annotations

import ipaddress
import urllib.request

import pytest

from decentralized_verl.sources.redirects import (
    GuardedRedirects,
    RedirectRefused,
    networks_from_env,
    redirect_problem,
)

SOURCE = "https://huggingface.co/org/m/resolve/main/w.bin"


@pytest.mark.parametrize(
    ("new", "addresses", "says"),
    [
        ("https://huggingface.co/other", [], None),
        ("https://cdn-lfs.hf.co/x", ["18.239.50.1"], None),
        ("http://cdn-lfs.hf.co/x", ["18.239.50.1"], "over http://"),
        ("https://internal/x", ["127.0.0.1"], "loopback"),
        ("https://meta/x", ["169.254.169.254"], "link-local"),
        ("https://intra/x", ["192.168.1.5"], "private"),
        ("https://v6/x", ["fd00::1"], "private"),
        ("https://mixed/x", ["18.239.50.1", "10.0.0.1"], "10.0.0.1"),
        ("https://cgnat/x", ["100.64.0.1"], "not public"),
        ("https://nowhere/x", [], "does not resolve"),
    ],
)
def test_redirect_rule(new: str, addresses: list[str], says: str | None) -> None:
    problem = redirect_problem(SOURCE, new, addresses)
    assert problem == says if says is None else says in (problem or ""), problem


def test_named_private_networks_may_be_redirected_to() -> None:
    allowed = networks_from_env({"FETCH_PRIVATE_REDIRECTS": "10.0.0.0/8, fd00::/8"})
    assert allowed == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))
    assert redirect_problem(SOURCE, "https://mirror/x", ["10.1.2.3"], allowed) is None
    assert "loopback" in (redirect_problem(SOURCE, "https://m/x", ["127.0.0.1"], allowed) or "")
    with pytest.raises(RedirectRefused, match="FETCH_PRIVATE_REDIRECTS"):
        networks_from_env({"FETCH_PRIVATE_REDIRECTS": "not-a-network"})


def test_the_authorization_header_stays_with_its_origin() -> None:
    handler = GuardedRedirects(resolver=lambda host: ["18.239.50.1"])
    request = urllib.request.Request(SOURCE, headers={"Authorization": "Bearer t", "User-Agent": "u"})
    same = handler.redirect_request(request, None, 302, "Found", {}, "https://huggingface.co/x")
    assert same is not None and same.get_header("Authorization") == "Bearer t"
    moved = handler.redirect_request(request, None, 302, "Found", {}, "https://cdn-lfs.hf.co/x")
    assert moved is not None and moved.get_header("Authorization") is None
    assert moved.get_header("User-agent") == "u"
    with pytest.raises(RedirectRefused, match="refusing the redirect to http://cdn"):
        handler.redirect_request(request, None, 302, "Found", {}, "http://cdn-lfs.hf.co/x")


def test_a_host_is_resolved_once_and_the_check_judges_that_answer() -> None:
    from decentralized_verl.sources.pinned import Pins

    answers = iter([["18.239.50.1"], ["127.0.0.1"]])
    asked: list[str] = []

    def rebinding(host: str) -> list[str]:
        asked.append(host)
        return next(answers)

    pins = Pins(rebinding)
    handler = GuardedRedirects(pins=pins)
    request = urllib.request.Request(SOURCE)
    assert handler.redirect_request(request, None, 302, "Found", {}, "https://cdn.example/x") is not None
    assert pins.addresses("CDN.example") == ["18.239.50.1"]  # what a connection dials: the checked answer
    assert asked == ["cdn.example"]
