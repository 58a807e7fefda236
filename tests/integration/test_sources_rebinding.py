"""DNS rebinding against the source fetcher, live: in a network namespace of its own (loopback and one
public address on `lo`, a resolv.conf naming a DNS server the test runs; nothing leaves the machine), a
source redirects to a name whose first DNS answer is public and every later one loopback. The fetcher
resolves the name once, checks that address and connects to it (TLS checked against the name): the
download comes from the public address, the internal service on loopback is never reached, and the name
is looked up once. The fetcher as it was (checking one answer, connecting by another) is shown reaching
the internal service, so the attack is real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from netlab.hosts import namespaces_refused

from tests.support.paths import ROOT

REFUSED = namespaces_refused()
pytestmark = pytest.mark.skipif(REFUSED is not None, reason=REFUSED or "")


@pytest.fixture
def namespace():
    name = f"dvrb{os.getpid()}"
    etc = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", "1.2.3.4/32", "dev", "lo"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:2 attempts:2\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        yield name
    finally:
        for file in ("resolv.conf", "hosts"):
            (etc / file).unlink(missing_ok=True)
        if etc.exists():
            etc.rmdir()
        subprocess.run(["ip", "netns", "del", name], check=False)


def attack(namespace: str, folder: Path, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testing")])}
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    command = [sys.executable, "-m", "tests.support.rebinding", str(folder), mode]
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, *command], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_address_checked_is_the_address_connected_to(namespace: str, tmp_path: Path) -> None:
    seen = attack(namespace, tmp_path / "pinned", "pinned")
    print(seen)
    assert seen["ok"], seen
    assert seen["bytes"] == "the weights the digest names"
    assert seen["hits"] == {"1.2.3.4": 1}, seen  # the internal service on loopback never reached
    assert seen["a_queries"] == 1, seen  # resolved once: checked, then dialled


def test_without_pinning_the_rebinding_reaches_the_internal_service(namespace: str, tmp_path: Path) -> None:
    seen = attack(namespace, tmp_path / "unpinned", "unpinned")
    print(seen)
    assert seen["hits"].get("127.0.0.1", 0) >= 1, seen
    assert seen["a_queries"] >= 2, seen
